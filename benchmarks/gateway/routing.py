"""Gateway benchmark, measured side by side in one run.

1. Overhead: the same closed-loop load (``--concurrency`` clients, streaming requests)
   straight to a fast stub worker and through the gateway in front of it, alternated;
   reports added p50/p99 latency and the maximum requests/s each path sustained. The
   same with one client (``--unloaded-seconds``): the gateway's own latency without the
   CPU queueing that 16 clients, the gateway and the worker cause on a small machine.
2. Routing: Poisson arrivals through the gateway to two stub workers that serve one
   request at a time, one of them ``--slow-factor`` times slower; JSQ vs round-robin
   p50/p99 TTFT.

    python -m benchmarks gateway routing --out results/gateway/bench.json

Writes JSON and a markdown table next to it, with the command at the top.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

from benchmarks.lib.procs import free_port, wait_healthy
from loadtest.schedule import arrival_times

STUB_WORKER = ["-m", "benchmarks.lib.stub_worker"]      # run by spawn(): a fast OpenAI-style stub, no model


def spawn(args: list[str], cwd: str | None = None) -> subprocess.Popen:
    """A Python child; with ``cwd``, ``-m`` modules are imported from that tree first."""
    return subprocess.Popen([sys.executable, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd)


async def one(client: httpx.AsyncClient, url: str) -> tuple[float, float]:
    t0 = time.perf_counter()
    ttft = None
    async with client.stream("POST", url + "/v1/completions",
                             json={"model": "stub", "prompt": "x", "max_tokens": 5, "stream": True}) as r:
        async for line in r.aiter_lines():
            # The first event with a choice (the gateway may re-serialise events: parse, not match bytes).
            if ttft is None and line.startswith("data: {") and json.loads(line[6:]).get("choices"):
                ttft = time.perf_counter() - t0
    return ttft or 0.0, time.perf_counter() - t0


async def closed_loop(url: str, concurrency: int, seconds: float) -> dict:
    lat = []
    stop = time.perf_counter() + seconds
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=concurrency * 2)) as c:
        async def client():
            while time.perf_counter() < stop:
                lat.append((await one(c, url))[1])

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        dur = time.perf_counter() - t0
    a = np.asarray(lat) * 1000
    return {"requests": len(lat), "rps": len(lat) / dur, "p50_ms": float(np.percentile(a, 50)),
            "p99_ms": float(np.percentile(a, 99))}


async def poisson(url: str, rate: float, n: int, seed: int) -> dict:
    offsets = arrival_times(n, rate, "poisson", seed=seed)
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=None)) as c:
        t0 = time.perf_counter()

        async def at(o):
            await asyncio.sleep(max(0.0, t0 + o - time.perf_counter()))
            return await one(c, url)

        res = await asyncio.gather(*(at(o) for o in offsets))
    ttft = np.asarray([r[0] for r in res]) * 1000
    return {"p50_ttft_ms": float(np.percentile(ttft, 50)), "p99_ttft_ms": float(np.percentile(ttft, 99)),
            "mean_ttft_ms": float(ttft.mean())}


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=8.0, help="per overhead round")
    ap.add_argument("--rounds", type=int, default=3, help="alternating direct/gateway rounds")
    ap.add_argument("--unloaded-seconds", type=float, default=4.0, help="per one-client round (0: skip)")
    ap.add_argument("--compare-tree", default=None,
                    help="also measure the gateway of another source tree (e.g. an older commit's gateway/ and "
                         "swiftserve/ unpacked there), in the same alternating rounds, as 'before'")
    ap.add_argument("--rate", type=float, default=8.0, help="Poisson req/s for the routing test")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--service-ms", type=float, default=50.0, help="fast worker time per request")
    ap.add_argument("--slow-factor", type=float, default=4.0)
    ap.add_argument("--out", default=None)


def main(a: argparse.Namespace) -> int:
    load_before = os.getloadavg()[0]          # other jobs on the machine skew every figure: recorded
    procs = []
    try:
        # ---- 1. overhead --------------------------------------------------------------------
        wp, gp = free_port(), free_port()
        w = f"http://127.0.0.1:{wp}"
        g = f"http://127.0.0.1:{gp}"
        procs.append(spawn([*STUB_WORKER, "--port", str(wp)]))
        procs.append(spawn(["-m", "gateway", "--workers", w, "--port", str(gp), "--log-level", "warning"]))
        paths = [("direct", w), ("gateway", g)]
        if a.compare_tree:
            bp = free_port()
            procs.append(spawn(["-m", "gateway", "--workers", w, "--port", str(bp), "--log-level", "warning"],
                               cwd=a.compare_tree))
            paths.append(("before", f"http://127.0.0.1:{bp}"))
        for _, url in paths:
            wait_healthy(url, interval=0.1)
        rounds = {f"{k}{sfx}": [] for k, _ in paths for sfx in ("", "_1")}
        for _ in range(a.rounds):
            for k, url in paths:
                rounds[k].append(asyncio.run(closed_loop(url, a.concurrency, a.seconds)))
                if a.unloaded_seconds:
                    rounds[k + "_1"].append(asyncio.run(closed_loop(url, 1, a.unloaded_seconds)))
        over = {k: {m: statistics.median(r[m] for r in v) for m in ("rps", "p50_ms", "p99_ms")}
                for k, v in rounds.items() if v}
        for sfx in ("", "_1") if a.unloaded_seconds else ("",):
            for k, _ in paths[1:]:
                tag = "" if k == "gateway" else "_" + k
                for q in ("p50", "p99"):
                    over[f"added_{q}_ms{tag}{sfx}"] = over[k + sfx][q + "_ms"] - over["direct" + sfx][q + "_ms"]
        over["rps_ratio"] = over["gateway"]["rps"] / over["direct"]["rps"]
        if a.compare_tree:
            over["rps_ratio_before"] = over["before"]["rps"] / over["direct"]["rps"]
        for p in procs:
            p.terminate()
        procs.clear()
        # ---- 2. routing with one slow worker -----------------------------------------------------
        s = a.service_ms / 1000
        fast_p, slow_p = free_port(), free_port()
        fast, slow = f"http://127.0.0.1:{fast_p}", f"http://127.0.0.1:{slow_p}"
        procs.append(spawn([*STUB_WORKER, "--port", str(fast_p), "--ttft", str(s / 2),
                            "--itl", str(s / 8), "--serial"]))
        procs.append(spawn([*STUB_WORKER, "--port", str(slow_p), "--ttft", str(s / 2 * a.slow_factor),
                            "--itl", str(s / 8 * a.slow_factor), "--serial"]))
        wait_healthy(fast, interval=0.1)
        wait_healthy(slow, interval=0.1)
        routing = {}
        for policy in ("jsq", "round_robin"):
            port = free_port()
            gw = spawn(["-m", "gateway", "--workers", f"{fast},{slow}", "--port", str(port), "--policy", policy,
                        "--log-level", "warning"])
            url = f"http://127.0.0.1:{port}"
            wait_healthy(url, interval=0.1)
            routing[policy] = asyncio.run(poisson(url, a.rate, a.requests, seed=0))
            gw.terminate()
            gw.wait(10)
    finally:
        for p in procs:
            p.terminate()
    cmd = a.command
    load = [load_before, os.getloadavg()[0]]
    result = {"command": cmd, "overhead": over, "overhead_rounds": rounds, "routing": routing,
              "settings": vars(a), "load_average_1min": load}
    md = [f"# Gateway benchmark\n\nCommand: `{cmd}`\n",
          f"Overhead ({a.concurrency} concurrent streaming clients, fast stub worker, medians of {a.rounds} "
          "alternating rounds, this machine: 2 cores shared by clients, gateway and worker; 1-minute load "
          f"average {load[0]:.1f} at the start, {load[1]:.1f} at the end):\n",
          "| path | requests/s | p50 latency (ms) | p99 latency (ms) |", "|---|---:|---:|---:|"]
    names = {"direct": "direct", "gateway": "gateway", "before": "gateway before (--compare-tree)"}
    for k, _ in paths:
        o = over[k]
        md.append(f"| {names[k]} | {o['rps']:.0f} | {o['p50_ms']:.1f} | {o['p99_ms']:.1f} |")
    md.append(f"\nAdded by the gateway: p50 {over['added_p50_ms']:+.1f} ms, p99 {over['added_p99_ms']:+.1f} ms; "
              f"requests/s {over['rps_ratio']:.0%} of direct.\n")
    if a.compare_tree:
        md.append(f"Added by the gateway before: p50 {over['added_p50_ms_before']:+.1f} ms, p99 "
                  f"{over['added_p99_ms_before']:+.1f} ms; requests/s {over['rps_ratio_before']:.0%} of direct.\n")
    if a.unloaded_seconds:
        md += ["One client (no CPU queueing):\n", "| path | requests/s | p50 latency (ms) | p99 latency (ms) |",
               "|---|---:|---:|---:|"]
        for k, _ in paths:
            o = over[k + "_1"]
            md.append(f"| {names[k]} | {o['rps']:.0f} | {o['p50_ms']:.2f} | {o['p99_ms']:.2f} |")
        md.append(f"\nAdded by the gateway with one client: p50 {over['added_p50_ms_1']:+.2f} ms, "
                  f"p99 {over['added_p99_ms_1']:+.2f} ms" + (
                      f"; before: p50 {over['added_p50_ms_before_1']:+.2f} ms, p99 {over['added_p99_ms_before_1']:+.2f} ms"
                      if a.compare_tree else "") + ".\n")
    md += [f"Routing (Poisson {a.rate} req/s, {a.requests} requests, two one-at-a-time workers, one "
           f"{a.slow_factor:g}x slower):\n", "| policy | p50 TTFT (ms) | p99 TTFT (ms) |", "|---|---:|---:|"]
    for k, v in routing.items():
        md.append(f"| {k} | {v['p50_ttft_ms']:.0f} | {v['p99_ttft_ms']:.0f} |")
    print("\n".join(md))
    if a.out:
        out = Path(a.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2))
        out.with_suffix(".md").write_text("\n".join(md) + "\n")
    return 0
