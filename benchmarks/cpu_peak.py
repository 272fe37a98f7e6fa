"""This CPU's measured float32 FMA peak, the yardstick for the GFLOP/s the benchmarks print.

    python benchmarks/cpu_peak.py --threads 2

Builds (once, cached like the engine's kernels) benchmarks/csrc/fma_peak.cpp, a loop of
independent fused multiply-adds on 16-float vectors: 16 accumulator chains per thread, enough
to keep two FMA pipes busy through their latency, no memory traffic. ``--threads`` threads run it at once for ``--seconds`` per
trial; the best of ``--trials`` is the peak (2 flops per lane per FMA). GEMM and attention
rates divided by this are the fractions of peak quoted in results/perf/README.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

FLOP_PER_ITER = 2 * 16 * 16          # per thread and loop iteration: 16 chains x 16 lanes, an FMA = 2 flops


def _module():
    from refengine.paged_kernel import _build_tag, load_extension   # keyed by the CPU's flags (-march=native)

    source = Path(__file__).resolve().parent / "csrc" / "fma_peak.cpp"
    return load_extension(f"swiftserve_fma_peak_{_build_tag()}", [source])


def _rate(mod, iters: int, threads: int) -> tuple[float, float]:
    """(GFLOP/s, seconds) of one run of ``iters`` iterations on ``threads`` threads."""
    seconds, _checksum = mod.fma_peak(iters, threads)
    return FLOP_PER_ITER * iters * threads / seconds / 1e9, seconds


def measure(threads: int, seconds: float = 0.3, trials: int = 5) -> float:
    """Best-of-``trials`` FMA rate in GFLOP/s with ``threads`` threads running together."""
    mod = _module()
    iters = 1 << 16
    while True:                                   # calibrate: one trial lasts about `seconds`
        _, elapsed = _rate(mod, iters, threads)
        if elapsed >= seconds / 4:
            break
        iters *= 4
    iters = int(iters * seconds / elapsed)
    return max(_rate(mod, iters, threads)[0] for _ in range(trials))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=0.3, help="length of one trial")
    ap.add_argument("--trials", type=int, default=5)
    args = ap.parse_args(argv)
    if args.threads < 1 or args.seconds <= 0 or args.trials < 1:
        ap.error("--threads and --trials must be >= 1 and --seconds > 0")
    peak = measure(args.threads, args.seconds, args.trials)
    print(f"float32 FMA peak, {args.threads} thread(s): {peak:.1f} GFLOP/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
