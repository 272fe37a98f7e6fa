"""Zero-loss failover, measured: streams in flight when a worker is killed or hangs.

    python benchmarks/failover_bench.py --out results/reliability/failover.json

Starts two real workers (``python -m worker``, SmolLM2-135M-Instruct on the reference
engine unless ``--model`` / ``--worker-python`` / ``--engine`` say otherwise) and a gateway
(``--policy jsq`` so the streams split between them, ``--stall-timeout``). Each scenario
sends ``--streams`` greedy streamed completions at once (distinct prompts, ``--max-tokens``
tokens each, ``ignore_eos``), waits until every stream has its first event, then:

* ``kill``: SIGKILL of one worker's process group (a vLLM worker's engine processes too);
* ``hang``: SIGSTOP of one worker's process group (the gateway's stall timeout must
  notice), SIGCONT after.

A stream *completed correctly* when it ends with ``[DONE]``, has no error event, keeps
one ``id``, reports ``completion_tokens`` = ``--max-tokens`` and its text equals the same
request's uninterrupted greedy text (asked of a worker directly, before the scenario).
The gateway's ``swiftserve_gateway_migrations_total`` says how many streams moved. Writes
``--out`` (per scenario: streams, completed, errors, lost, migrations) with the figures
``kill_midstream_completed_pct``, ``hang_midstream_completed_pct`` and
``migrated_greedy_identical`` (true when at least one stream migrated and every stream's
text equals its uninterrupted run), which ``benchmarks/reliability_summary.py`` merges into
``summary.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import command_line, write_json  # noqa: E402

TOPICS = ["dragons", "the sea", "tea", "mountains", "robots", "gardens", "trains", "the moon", "bees", "rivers",
          "castles", "winter", "music", "cities", "forests", "ships", "clocks", "bridges", "owls", "deserts"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, cmd: list[str], port: int) -> None:
        self.cmd, self.url = cmd, f"http://127.0.0.1:{port}"
        self.log = tempfile.TemporaryFile(mode="w+")
        # Its own process group: a vLLM worker's engine runs in child processes, and a fault (or
        # stop) must reach them all, as a pod's death or a node's hang does. Signalling the API
        # process alone left the killed worker's engine running, orphaned, beside the next scenario.
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def wait_healthy(self, timeout: float) -> "Server":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"{self.cmd[:4]} exited: {self.log.read()[-2000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.url} never became healthy")

    def stop(self) -> None:
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGKILL)
        self.proc.wait(30)


def body(i: int, max_tokens: int) -> dict:
    return {"model": "m", "prompt": f"Write a long story about {TOPICS[i % len(TOPICS)]}.", "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}


def judge(data: bytes, want: str, max_tokens: int) -> str:
    """complete (correct), wrong (complete but not the uninterrupted text), error, or lost."""
    events = [e for e in data.decode(errors="replace").split("\n\n") if e]
    if not events or events[-1] != "data: [DONE]":
        return "lost"
    objs = [json.loads(e[len("data: "):]) for e in events[:-1]]
    if any("error" in o for o in objs):
        return "error"
    text = "".join(c.get("text") or "" for o in objs for c in o.get("choices", []))
    usage = objs[-1].get("usage") or {}
    ok = len({o.get("id") for o in objs}) == 1 and usage.get("completion_tokens") == max_tokens and text == want
    return "complete" if ok else "wrong"


async def stream(client, url: str, payload: dict, first: asyncio.Event) -> bytes:
    data = b""
    try:
        async with client.stream("POST", url + "/v1/completions", json=payload) as r:
            async for chunk in r.aiter_raw():
                data += chunk
                first.set()
    except httpx.HTTPError:
        first.set()
    return data


def migrations(gw: Server) -> float:
    text = httpx.get(gw.url + "/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("swiftserve_gateway_migrations_total{") and 'outcome="resumed"' in line)


async def scenario(gw: Server, victim: Server, kind: str, n: int, max_tokens: int, wants: list[str]) -> dict:
    before = migrations(gw)
    async with httpx.AsyncClient(timeout=600) as client:
        firsts = [asyncio.Event() for _ in range(n)]
        tasks = [asyncio.create_task(stream(client, gw.url, body(i, max_tokens), firsts[i])) for i in range(n)]
        for f in firsts:
            await asyncio.wait_for(f.wait(), 300)
        victim.signal(signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
        results = await asyncio.gather(*tasks)
    if kind == "hang":
        victim.signal(signal.SIGCONT)
    outcomes = [judge(d, wants[i], max_tokens) for i, d in enumerate(results)]
    counts = {k: outcomes.count(k) for k in ("complete", "wrong", "error", "lost")}
    return {"streams": n, **counts, "migrations": migrations(gw) - before,
            "completed_pct": round(100.0 * counts["complete"] / n, 1),
            "error_messages": sorted(set(filter(None, (_error_text(d) for d in results))))[:5]}


def _error_text(data: bytes) -> str | None:
    """The first error event's message of a stream (what a failed stream told its client)."""
    for e in data.decode(errors="replace").split("\n\n"):
        if e.startswith("data: {") and '"error"' in e:
            err = json.loads(e[len("data: "):]).get("error") or {}
            return f"{err.get('code')}: {str(err.get('message'))[:160]}"
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="results/reliability/failover.json")
    ap.add_argument("--model", default=None, help="model directory (default: the prepared SmolLM2-135M-Instruct)")
    ap.add_argument("--engine", default="reference", help="worker --engine (reference or vllm)")
    ap.add_argument("--worker-python", default=sys.executable, help="interpreter that runs the workers")
    ap.add_argument("--streams", type=int, default=16, help="streams in flight when the fault happens")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--stall-timeout", type=float, default=5.0, help="the gateway's --stall-timeout (s)")
    ap.add_argument("--torch-threads", type=int, default=1)
    a = ap.parse_args(argv)
    model = a.model
    if model is None:
        from modelkit.prepare import ensure_default_model
        model = str(ensure_default_model())

    def worker(port: int | None = None) -> Server:
        port = port or free_port()
        return Server([a.worker_python, "-m", "worker", "--engine", a.engine, "--model", model, "--port", str(port),
                       "--served-model-name", "m", "--max-model-len", "512", "--torch-threads", str(a.torch_threads),
                       "--log-level", "warning"], port)

    def gateway(workers: list[Server]) -> Server:
        port = free_port()
        return Server([sys.executable, "-m", "gateway", "--port", str(port), "--policy", "jsq",
                       "--workers", ",".join(w.url for w in workers), "--health-interval", "0.2",
                       "--stall-timeout", str(a.stall_timeout), "--log-level", "warning"], port)

    started: list[Server] = []
    try:
        a_w, b_w = worker(), worker()
        started += [a_w, b_w]
        for w in (a_w, b_w):
            w.wait_healthy(600)
        wants = []
        for i in range(a.streams):
            r = httpx.post(a_w.url + "/v1/completions", json={**body(i, a.max_tokens), "stream": False,
                                                              "stream_options": None}, timeout=600)
            wants.append(r.json()["choices"][0]["text"])
        gw = gateway([a_w, b_w])
        started.append(gw)
        gw.wait_healthy(60)
        kill = asyncio.run(scenario(gw, a_w, "kill", a.streams, a.max_tokens, wants))
        print("kill:", kill, flush=True)
        a_w.stop()
        a2 = worker(int(a_w.url.rsplit(":", 1)[1]))          # back on its port: the gateway's static list
        started.append(a2)
        a2.wait_healthy(600)
        time.sleep(2)                                         # health checks readmit it
        hang = asyncio.run(scenario(gw, b_w, "hang", a.streams, a.max_tokens, wants))
        print("hang:", hang, flush=True)
    finally:
        for s in started:
            s.stop()
    identical = (kill["migrations"] + hang["migrations"]) > 0 and kill["wrong"] == hang["wrong"] == 0
    doc = {"command": command_line(argv), "engine": a.engine, "streams": a.streams, "max_tokens": a.max_tokens,
           "stall_timeout_s": a.stall_timeout, "kill": kill, "hang": hang,
           "figures": {"kill_midstream_completed_pct": kill["completed_pct"],
                       "hang_midstream_completed_pct": hang["completed_pct"],
                       "migrated_greedy_identical": identical}}
    write_json(a.out, doc)
    print(json.dumps(doc["figures"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
