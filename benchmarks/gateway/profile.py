"""Where the gateway's CPU goes on the proxy path: py-spy samples of a gateway process
under the overhead load of benchmarks/gateway/routing.py (closed loop, streaming, fast stub
worker), plus the CPU time of each process of the run (client, gateway, worker).

    python -m benchmarks gateway profile --out results/gateway/profile.md

``--folded FILE`` keeps the raw collapsed stacks (for flame graphs).
Self time of native code (uvloop, socket syscalls) is counted on the Python frame that
called into it, so the event loop's own work shows up as ``asyncio/runners.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import tempfile
import time
from pathlib import Path

from benchmarks.gateway.routing import STUB_WORKER, closed_loop, spawn
from benchmarks.lib.procs import free_port, wait_healthy
from benchmarks.lib.profiling import process_cpu_seconds as cpu_seconds, py_spy


def frame_key(frame: str) -> str:
    name, _, where = frame.partition(" (")
    path = where.split(":")[0]
    path = path.split("site-packages/")[-1] if "site-packages/" in path else "/".join(path.split("/")[-2:])
    return f"{name} ({path})"


def package(frame: str) -> str:
    return frame_key(frame).rsplit("(", 1)[-1].split("/")[0].rstrip(")")


def summarize(folded: str, top: int) -> tuple[int, list, list]:
    total, incl, selfp = 0, collections.Counter(), collections.Counter()
    for line in folded.splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack:
            continue
        n, frames = int(n), stack.split(";")
        total += n
        for key in {frame_key(f) for f in frames}:
            incl[key] += n
        selfp[package(frames[-1])] += n
    return total, incl.most_common(top), selfp.most_common(12)


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--out", required=True)
    ap.add_argument("--folded", default=None, help="keep the collapsed stacks here (for flame graphs)")


def main(a: argparse.Namespace) -> int:
    wp, gp = free_port(), free_port()
    worker = spawn([*STUB_WORKER, "--port", str(wp)])
    gw = spawn(["-m", "gateway", "--workers", f"http://127.0.0.1:{wp}", "--port", str(gp), "--log-level", "warning"])
    out = Path(a.out)
    folded = Path(a.folded) if a.folded else Path(tempfile.mkstemp(suffix=".folded")[1])
    try:
        wait_healthy(f"http://127.0.0.1:{wp}", interval=0.1)
        wait_healthy(f"http://127.0.0.1:{gp}", interval=0.1)
        asyncio.run(closed_loop(f"http://127.0.0.1:{gp}", a.concurrency, 2.0))       # warm connections
        cpu0 = {"gateway": cpu_seconds(gw.pid), "worker": cpu_seconds(worker.pid)}
        client0, t0 = time.process_time(), time.perf_counter()
        spy = py_spy(gw.pid, folded, a.seconds)
        load = asyncio.run(closed_loop(f"http://127.0.0.1:{gp}", a.concurrency, a.seconds))
        wall = time.perf_counter() - t0
        cpu = {"client": time.process_time() - client0,
               "gateway": cpu_seconds(gw.pid) - cpu0["gateway"], "worker": cpu_seconds(worker.pid) - cpu0["worker"]}
        spy.wait(60)
    finally:
        for p in (gw, worker):
            p.terminate()
    total, incl, pkgs = summarize(folded.read_text(), a.top)
    if not a.folded:
        folded.unlink()
    n = load["requests"]
    cmd = a.command
    md = [f"# Gateway proxy-path profile\n\nCommand: `{cmd}`\n",
          f"{a.concurrency} concurrent streaming clients through the gateway for {a.seconds:g} s: {n} requests, "
          f"{load['rps']:.0f} requests/s, p50 {load['p50_ms']:.1f} ms; 1-minute load average "
          f"{os.getloadavg()[0]:.1f} (other jobs on the machine).\n",
          "CPU per request by process (ms; the machine has 2 cores for all three):\n",
          "| process | CPU s | CPU ms / request | share of a core |", "|---|---:|---:|---:|"]
    for k, v in cpu.items():
        md.append(f"| {k} | {v:.2f} | {v / max(n, 1) * 1000:.2f} | {v / wall:.0%} |")
    md += [f"\npy-spy samples of the gateway: {total}. Self time by package:\n", "| package | share |", "|---|---:|"]
    md += [f"| {k} | {v / total:.1%} |" for k, v in pkgs]
    md += ["\nInclusive time by function:\n", "| function | share |", "|---|---:|"]
    md += [f"| `{k}` | {v / total:.1%} |" for k, v in incl]
    print("\n".join(md))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(md) + "\n")
    return 0
