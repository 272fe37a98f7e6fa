"""Which of issue 47's regressions a slow normal request overlapped, against a real stack.

    PYTHONPATH=$PWD python -m studies.hostile_overlap [--passes 2] [--rounds 3]

Starts the stack of ``benchmarks/serve/hostile.py`` (``swiftserve up --workers 1``, every limit at
its default) and runs its part 2 (``latency_timeline``) ``--passes`` times: 10 normal chats alone, then normal chats in a
loop while the regressions of ``benchmarks.lib.fuzz.regressions`` are sent one after another
``--rounds`` times. Prints the alone median and max, and for each normal request that overlapped a
regression its latency and the (body bytes, ms, status) of every regression it overlapped: a
normal request that spans a round waits for every multi-megabyte body parsed on the gateway's and
the worker's event loops meanwhile (stop 66's diagnosis in results/reliability/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from pathlib import Path

from benchmarks.lib.procs import free_port
from benchmarks.serve.hostile import Stack, latency_timeline


async def one_pass(stack: Stack, rounds: int) -> None:
    alone, beside, hostile = await latency_timeline(stack, 10, rounds, 120.0)
    ms = [1e3 * (e - s) for s, e, _ in alone]
    print(f"alone: median {statistics.median(ms):.1f} ms, max {max(ms):.1f} ms")
    for s, e, _ in beside:
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
