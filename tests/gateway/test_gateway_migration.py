"""Stream migration (gateway.migration, gateway.failover) with the real SmolLM2 worker.

One real reference-engine worker (``conftest.worker``, shared by the migration modules); relay
workers (``relay_worker.py``) stand in front of it and fail mid-stream on cue: cut, stall, a
retryable error event, a drain abort, or SIGKILL of the relay process. Each gateway has
two relays, so a migrated stream resumes on the other one with the real worker's tokens.
One test drains a second real worker (SIGTERM past its drain timeout) under the gateway;
one kills the worker a stream had migrated to (a second migration).
Invariant checked: the client's stream is one complete answer (same ``id`` throughout, one
chat role chunk, no ``token_ids`` unless asked, ``[DONE]`` at the end) whose greedy text is
exactly the text of an uninterrupted run, with the whole generation's ``usage``.
"""

import asyncio
import json
import signal
import sys
import time
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from fault_support import (HERE, Proc, gateway, gateway_in_flight, real_worker, request,  # noqa: E402
                           run_requests, wait_for)
from benchmarks.lib.procs import free_port  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.model]
N = 32
COMPLETION = {"model": "m", "prompt": "Write a long story about a dragon who loves tea.", "max_tokens": N,
              "temperature": 0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "Tell me about the sea in three sentences."}],
        "max_tokens": N, "temperature": 0, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True}}


@pytest.fixture
def procs():
    started = []
    yield started
    for p in reversed(started):
        p.kill()


def relay(procs, worker, fail: str, after: int = 6, delay: float = 0.0, queue: int | None = None) -> Proc:
    port = free_port()
    extra = ["--queue", str(queue)] if queue is not None else []
    p = Proc([sys.executable, str(HERE / "relay_worker.py"), "--port", str(port), "--upstream", worker.url,
              "--fail", fail, "--after", str(after), "--delay", str(delay), *extra], f"http://127.0.0.1:{port}")
    procs.append(p)
    return p.wait_ready()


def events(data: bytes) -> list:
    out = [e[len("data: "):] for e in data.decode().split("\n\n") if e]
    assert out[-1] == "[DONE]", data[-300:]
    return [json.loads(e) for e in out[:-1]]


def joined(objs: list, chat: bool) -> str:
    key = (lambda c: (c.get("delta") or {}).get("content") or "") if chat else (lambda c: c.get("text") or "")
    return "".join(key(c) for o in objs for c in o.get("choices", []))


def check_stream(data: bytes, expected: str, chat: bool) -> list:
    objs = events(data)
    assert not any("error" in o for o in objs), objs[-3:]
    assert len({o["id"] for o in objs}) == 1                      # one stream, whatever worker sent each part
    assert joined(objs, chat) == expected
    finishes = [c["finish_reason"] for o in objs for c in o.get("choices", []) if c.get("finish_reason")]
    assert finishes == ["length"]
    assert objs[-1]["usage"]["completion_tokens"] == N
    assert not any("token_ids" in c for o in objs for c in o.get("choices", []))
    if chat:
        assert sum("role" in c.get("delta", {}) for o in objs for c in o.get("choices", [])) == 1
    return objs


@pytest.fixture(scope="module")
def expected(worker):
    """The uninterrupted greedy texts, straight from the worker."""
    out = {}
    for name, body, path in (("completion", COMPLETION, "/v1/completions"), ("chat", CHAT, "/v1/chat/completions")):
        r = httpx.post(worker.url + path, json={**body, "stream": False, "stream_options": None}, timeout=120)
        c = r.json()["choices"][0]
        out[name] = c["message"]["content"] if name == "chat" else c["text"]
    return out


def migrated_metric(gw: Proc, reason: str | None = None) -> float:
    """Resumed migrations counted by the gateway (for one failure reason, or all)."""
    text = httpx.get(gw.url + "/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("swiftserve_gateway_migrations_total{") and 'outcome="resumed"' in line
               and (reason is None or f'reason="{reason}"' in line))


@pytest.mark.parametrize("fail,reason", [("cut", "truncated_stream"), ("error", "worker_error"),
                                         ("drain", "worker_drain")])
def test_greedy_stream_migrated_mid_stream_equals_the_uninterrupted_run(procs, worker, expected, fail, reason):
    gw = gateway([relay(procs, worker, fail), relay(procs, worker, fail)])
    procs.append(gw)
    for name, body, path in (("completion", COMPLETION, "/v1/completions"), ("chat", CHAT, "/v1/chat/completions")):
        status, data, _ = run_requests(lambda c: request(c, gw.url + path, body))
        assert status == 200
        check_stream(data, expected[name], name == "chat")
    assert migrated_metric(gw, reason) == 2
    assert not any(gateway_in_flight(gw).values())


def test_client_asking_for_token_ids_gets_them_all(procs, worker, expected):
    gw = gateway([relay(procs, worker, "cut"), relay(procs, worker, "cut")])
    procs.append(gw)
    status, data, _ = run_requests(lambda c: request(c, gw.url + "/v1/completions",
                                                     {**COMPLETION, "return_token_ids": True}))
    ids = [t for o in events(data) for c in o.get("choices", []) for t in c.get("token_ids") or []]
    assert len(ids) == N


def test_stalled_worker_times_out_and_the_stream_migrates(procs, worker, expected):
    gw = gateway([relay(procs, worker, "stall"), relay(procs, worker, "stall")], "--stall-timeout", "1")
    procs.append(gw)
    status, data, _ = run_requests(lambda c: request(c, gw.url + "/v1/completions", COMPLETION))
    check_stream(data, expected["completion"], chat=False)
    assert migrated_metric(gw, "timeout") == 1


def test_sigkill_of_one_of_two_workers_with_streams_in_flight(procs, worker, expected):
    a, b = relay(procs, worker, "none", delay=0.1), relay(procs, worker, "none", delay=0.1)
    gw = gateway([a, b], "--policy", "jsq")
    procs.append(gw)
    n = 6

    async def scenario(client):
        firsts = [asyncio.Event() for _ in range(n)]
        tasks = [asyncio.create_task(request(client, gw.url + "/v1/completions", COMPLETION, f)) for f in firsts]
        for f in firsts:
            await asyncio.wait_for(f.wait(), 60)
        a.signal(signal.SIGKILL)
        return await asyncio.gather(*tasks)

    results = run_requests(scenario)
    for status, data, _ in results:
        assert status == 200
        check_stream(data, expected["completion"], chat=False)
    assert migrated_metric(gw) >= 1             # the streams that were on a (jsq spreads them)
    wait_for(lambda: not any(gateway_in_flight(gw).values()), 10, "gateway in-flight back to zero")


def test_the_worker_a_stream_migrated_to_dies_too(procs, worker, expected):
    # jsq by the relays' reported queues: the stream starts on `early`, migrates to `late`, then to `sound`
    early, late = relay(procs, worker, "exit", after=5, queue=0), relay(procs, worker, "exit", after=14, queue=50)
    sound = relay(procs, worker, "none", queue=100)
    gw = gateway([early, late, sound], "--policy", "jsq", "--max-migrations", "2")
    procs.append(gw)
    time.sleep(1)                                   # the scrapes have seen the queues
    status, data, _ = run_requests(lambda c: request(c, gw.url + "/v1/completions", COMPLETION))
    check_stream(data, expected["completion"], chat=False)
    assert migrated_metric(gw) == 2
    assert early.proc.wait(5) == 1 and late.proc.wait(5) == 1        # both died mid-stream


def test_streams_of_a_worker_whose_drain_time_runs_out_migrate(procs, worker, smollm2_dir):
    long = {**COMPLETION, "max_tokens": 160}
    want = httpx.post(worker.url + "/v1/completions", json={**long, "stream": False, "stream_options": None},
                      timeout=300).json()["choices"][0]["text"]
    second = real_worker(smollm2_dir, "--drain-timeout", "0.5", "--log-level", "info")
    procs.append(second)
    second.wait_ready(300)
    gw = gateway([worker, second], "--policy", "jsq")
    procs.append(gw)
    n = 4

    async def scenario(client):
        firsts = [asyncio.Event() for _ in range(n)]
        tasks = [asyncio.create_task(request(client, gw.url + "/v1/completions", long, f)) for f in firsts]
        for f in firsts:
            await asyncio.wait_for(f.wait(), 120)
        second.signal(signal.SIGTERM)
        return await asyncio.gather(*tasks)

    results = run_requests(scenario)
    for status, data, _ in results:
        objs = events(data)
        assert not any("error" in o for o in objs), objs[-3:]
        assert joined(objs, chat=False) == want and objs[-1]["usage"]["completion_tokens"] == 160
    assert second.proc.wait(30) == 0 and "aborting" in second.output()
    assert migrated_metric(gw, "worker_drain") >= 1
