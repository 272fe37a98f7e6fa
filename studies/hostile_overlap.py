"""Which of issue 47's regressions a slow normal request overlapped, against a real stack.

    PYTHONPATH=$PWD python -m studies.hostile_overlap [--passes 2] [--rounds 3]

Starts the stack of ``benchmarks/serve/hostile.py`` (``swiftserve up --workers 1``, every limit at
its default) and runs its part 2 ``--passes`` times: 10 normal chats alone, then normal chats in a
loop while the regressions of ``benchmarks.lib.fuzz.regressions`` are sent one after another
``--rounds`` times. Prints the alone median and max, and for each normal request that overlapped a
regression its latency and the (body bytes, ms, status) of every regression it overlapped: a
normal request that spans a round waits for every multi-megabyte body parsed on the gateway's and
the worker's event loops meanwhile (stop 66's diagnosis in results/reliability/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.lib.fuzz import regressions
from benchmarks.lib.procs import free_port
from benchmarks.serve.hostile import NORMAL, Stack, tame


async def one_pass(stack: Stack, rounds: int) -> None:
    body = {"model": stack.model, **NORMAL}
    bodies = [(path, tame(json.dumps(case).encode(), stack.model, path)) for path, case in regressions()]
    async with httpx.AsyncClient(timeout=120) as client:
        async def normal() -> tuple[float, float]:
            t = time.monotonic()
            await client.post(stack.gw + "/v1/chat/completions", json=body)
            return t, time.monotonic()

        alone = [await normal() for _ in range(10)]
        hostile: list[tuple[float, float, int, int]] = []
        beside: list[tuple[float, float]] = []
        stop = asyncio.Event()

        async def normals() -> None:
            while not stop.is_set():
                beside.append(await normal())

        async def hostiles() -> None:
            for _ in range(rounds):
                for path, raw in bodies:
                    t = time.monotonic()
                    r = await client.post(stack.gw + path, content=raw, headers={"content-type": "application/json"})
                    hostile.append((t, time.monotonic(), r.status_code, len(raw)))
            stop.set()

        await asyncio.gather(normals(), hostiles())
    ms = [1e3 * (e - s) for s, e in alone]
    print(f"alone: median {statistics.median(ms):.1f} ms, max {max(ms):.1f} ms")
    for s, e in beside:
        over = [(n, round(1e3 * (he - hs)), st) for hs, he, st, n in hostile if s < he and e > hs]
        if over:
            print(f"normal {1e3 * (e - s):7.1f} ms beside {over}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    base = free_port(2)
    stack = Stack(base, base + 1, Path(tempfile.gettempdir()) / f"hostile-overlap-{base}.log")
    try:
        for _ in range(args.passes):
            asyncio.run(one_pass(stack, args.rounds))
    finally:
        stack.stop()


if __name__ == "__main__":
    main()
