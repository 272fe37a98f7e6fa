"""Locust, open loop: absolute Poisson arrival times shared by all users (no think time).

Headless example (gateway on :8000; users only bound concurrency, the rate sets the load):

    locust -f loadtest/locustfile.py --headless --host http://127.0.0.1:8000 \
        --users 64 --spawn-rate 64 --run-time 60s --rate 2 --input-len 1000 --output-len 100

Each request streams; besides Locust's own row per request ("POST completions", whole
response time), TTFT and TPOT are reported as custom request types ("TTFT", "TPOT")
so they appear in Locust's statistics and CSV output. Prompts are random token ids
(exact lengths; ``--input-len``), as in ``swiftserve-loadtest``.
"""

from __future__ import annotations

import json
import threading
import time

import gevent
from locust import HttpUser, events, task

from loadtest.datasets import random_prompts
from loadtest.schedule import arrival_times

_lock = threading.Lock()
_state: dict = {}


@events.init_command_line_parser.add_listener
def _args(parser):
    parser.add_argument("--rate", type=float, default=1.0, help="requests/s (open loop, Poisson)")
    parser.add_argument("--input-len", type=int, default=1000)
    parser.add_argument("--output-len", type=int, default=100)
    parser.add_argument("--num-requests", type=int, default=100000, help="schedule length")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model-name", default="", help="model (default: first of /v1/models)")


@events.test_start.add_listener
def _start(environment, **_kw):
    o = environment.parsed_options
    _state.update(start=time.perf_counter(), i=0,
                  times=arrival_times(o.num_requests, o.rate, "poisson", 1.0, o.seed),
                  prompts=random_prompts(min(o.num_requests, 512), o.input_len, o.output_len, seed=o.seed))


def _next_slot() -> tuple[int, float] | None:
    with _lock:
        i = _state["i"]
        if i >= len(_state["times"]):
            return None
        _state["i"] = i + 1
        return i, _state["start"] + _state["times"][i]


class OpenLoopUser(HttpUser):
    def on_start(self):
        o = self.environment.parsed_options
        self.model = o.model_name or self.client.get("/v1/models").json()["data"][0]["id"]

    @task
    def generate(self):
        slot = _next_slot()
        if slot is None:
            self.environment.runner.quit()
            return
        i, at = slot
        delay = at - time.perf_counter()
        if delay > 0:
            gevent.sleep(delay)
        spec = _state["prompts"][i % len(_state["prompts"])]
        body = {"model": self.model, "prompt": spec.prompt, "max_tokens": spec.max_tokens, "min_tokens": spec.max_tokens,
                "ignore_eos": True, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
        t0 = time.perf_counter()
        first = last = None
        tokens = 0
        with self.client.post("/v1/completions", json=body, stream=True, catch_response=True,
                              name="POST completions") as r:
            if r.status_code != 200:
                r.failure(f"HTTP {r.status_code}")
                return
            for line in r.iter_lines():
                if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
                    continue
                obj = json.loads(line[5:])
                if obj.get("usage"):
                    tokens = obj["usage"]["completion_tokens"]
                if any(c.get("text") for c in obj.get("choices") or []):
                    last = time.perf_counter()
                    first = first or last
            if first is None:
                r.failure("no tokens")
                return
            r.success()
        fire = self.environment.events.request.fire
        # Locust times a streamed request to its response headers; E2E is to the last token.
        fire(request_type="E2E", name="completions", response_time=(last - t0) * 1000, response_length=tokens,
             exception=None, context={})
        fire(request_type="TTFT", name="completions", response_time=(first - t0) * 1000, response_length=0,
             exception=None, context={})
        if tokens > 1:
            fire(request_type="TPOT", name="completions", response_time=(last - first) * 1000 / (tokens - 1),
                 response_length=tokens, exception=None, context={})
