"""Rolling restart under load: does restarting every worker lose or fail any request?

    python -m benchmarks gateway rolling_restart --out results/reliability/rolling_restart.json

Starts ``swiftserve up`` (``--workers`` real SmolLM2 workers, reference engine, and a
gateway), sends Poisson arrivals at ``--rate`` requests/s of greedy streamed completions
(``--max-tokens`` each), sends SIGHUP after ``--warmup`` seconds (swiftserve.rolling: each
worker drains for ``--drain-timeout`` s, starts again and is routed to before the next),
and keeps the load on until ``--after`` seconds past the rolling restart's "done". A request
*succeeded* when it is a 200 stream ending with ``[DONE]`` with no error event and
``completion_tokens`` = ``--max-tokens``. Writes ``--out`` with the counts, the gateway's
migrations and retries (from its ``/metrics``) and
``rolling_restart_errors`` (requests that did not succeed), which
``benchmarks/report/reliability.py`` merges into ``summary.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

import httpx

from benchmarks.lib.procs import free_port
from benchmarks.lib.records import write_json


def ok(status: int | None, data: bytes, max_tokens: int) -> bool:
    events = [e for e in data.decode(errors="replace").split("\n\n") if e]
    if status != 200 or not events or events[-1] != "data: [DONE]":
        return False
    try:
        objs = [json.loads(e[len("data: "):]) for e in events[:-1]]
    except ValueError:
        return False
    return not any("error" in o for o in objs) and (objs[-1].get("usage") or {}).get("completion_tokens") == max_tokens


def counters(metrics: str) -> dict:
    """The gateway's migrations (resumed streams) and retries before the first byte, by reason."""
    out: dict[str, float] = {}
    for line in metrics.splitlines():
        for name in ("swiftserve_gateway_migrations_total{", "swiftserve_gateway_retries_total{"):
            if line.startswith(name):
                key = name[len("swiftserve_gateway_"):-len("_total{")] + ":" + line.split('reason="')[1].split('"')[0]
                if "outcome=" in line:
                    key += ":" + line.split('outcome="')[1].split('"')[0]
                out[key] = out.get(key, 0) + float(line.rsplit(" ", 1)[1])
    return out


async def one(client, url: str, i: int, max_tokens: int) -> tuple[int | None, bytes]:
    body = {"model": "m", "prompt": f"Request {i}: tell me a story.", "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    data, status = b"", None
    try:
        async with client.stream("POST", url + "/v1/completions", json=body) as r:
            status = r.status_code
            async for chunk in r.aiter_raw():
                data += chunk
    except httpx.HTTPError as exc:
        data += repr(exc).encode()
    return status, data


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", default="results/reliability/rolling_restart.json")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rate", type=float, default=4.0, help="Poisson arrivals per second")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--drain-timeout", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds of load before the SIGHUP")
    ap.add_argument("--after", type=float, default=5.0, help="seconds of load after the restart is done")
    ap.add_argument("--seed", type=int, default=0)


def main(a: argparse.Namespace) -> int:
    port, wport = free_port(), free_port(a.workers)      # the workers take consecutive ports from wport
    cmd = [sys.executable, "-m", "swiftserve", "up", "--workers", str(a.workers), "--port", str(port),
           "--worker-base-port", str(wport), "--served-model-name", "m", "--drain-timeout", str(a.drain_timeout),
           "--worker-arg=--max-model-len=512"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    ready, done = threading.Event(), threading.Event()

    def read():
        for line in proc.stdout:
            lines.append(line.rstrip())
            if "Gateway ready" in line:
                ready.set()
            if "rolling restart: done" in line or "stopping the rolling restart" in line:
                done.set()

    threading.Thread(target=read, daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    try:
        if not ready.wait(600):
            raise RuntimeError("the stack did not start:\n" + "\n".join(lines[-30:]))

        async def load():
            rng, tasks, t0, hup_at, end = random.Random(a.seed), [], time.monotonic(), None, None
            async with httpx.AsyncClient(timeout=600) as client:
                i = 0
                while end is None or time.monotonic() < end:
                    await asyncio.sleep(rng.expovariate(a.rate))
                    tasks.append(asyncio.create_task(one(client, url, i, a.max_tokens)))
                    i += 1
                    if hup_at is None and time.monotonic() - t0 >= a.warmup:
                        hup_at = time.monotonic()
                        os.kill(proc.pid, signal.SIGHUP)
                    if end is None and (done.is_set() or (hup_at and time.monotonic() - hup_at > 600)):
                        end = time.monotonic() + a.after
                results = await asyncio.gather(*tasks)
            return results, (end - a.after) - hup_at, time.monotonic() - t0

        results, restart_s, load_s = asyncio.run(load())
        gateway_counts = counters(httpx.get(url + "/metrics", timeout=10).text)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    good = sum(ok(s, d, a.max_tokens) for s, d in results)
    completed = any("rolling restart: done" in line for line in lines)
    doc = {"command": a.command, "workers": a.workers, "rate": a.rate, "max_tokens": a.max_tokens,
           "drain_timeout_s": a.drain_timeout, "requests": len(results), "succeeded": good,
           "failed": len(results) - good, "rolling_restart_completed": completed,
           "rolling_restart_s": round(restart_s, 1), "load_s": round(load_s, 1), "gateway": gateway_counts,
           "log": [line for line in lines if "rolling restart" in line or "started again" in line],
           "figures": {"rolling_restart_errors": len(results) - good} if completed else {}}
    write_json(a.out, doc)
    print(json.dumps({k: v for k, v in doc.items() if k != "log"}))
    return 0 if completed else 1
