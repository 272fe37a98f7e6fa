"""This CPU's measured float32 FMA peak and bfloat16 dot-product peak, the yardsticks for the
GFLOP/s the benchmarks print.

    python -m benchmarks kernel cpu_peak --threads 2
    python -m benchmarks kernel cpu_peak --threads 2 --dtype bfloat16
    python -m benchmarks kernel cpu_peak --threads 2 --bandwidth          # memory read bandwidth

Builds (once, cached like the engine's kernels) benchmarks/kernel/csrc/fma_peak.cpp, a loop of
independent fused multiply-adds on 16-float vectors: 16 accumulator chains per thread, enough
to keep two FMA pipes busy through their latency, no memory traffic. ``--threads`` threads run it at once for ``--seconds`` per
trial; the best of ``--trials`` is the peak (2 flops per lane per FMA). ``--dtype bfloat16`` runs
the same loop with AVX-512-BF16's vdpbf16ps (each float32 lane adds two bf16 products: 4 flops),
the instruction oneDNN's bf16 GEMMs are built on; it exits 2 where the CPU has none. GEMM and
attention rates divided by these are the fractions of peak quoted in results/perf/README.md.
``--bandwidth`` instead measures the memory read bandwidth decode is bound by: the best of
``--trials`` sums of a 1 GiB float32 tensor (far larger than any cache) on ``--threads`` threads, in GB/s
(torch's float32 sum is vectorised and streams; its bf16 sum converts and is compute-bound).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.lib.records import UsageError


# Per thread and loop iteration: 16 chains x 16 lanes; an FMA = 2 flops, a vdpbf16ps lane = 2 products = 4.
FLOP_PER_ITER = {"float32": 2 * 16 * 16, "bfloat16": 4 * 16 * 16}
LOOPS = {"float32": "fma_peak", "bfloat16": "bf16_peak"}


def _module():
    from refengine.paged_kernel import _build_tag, load_extension   # keyed by the CPU's flags (-march=native)

    source = Path(__file__).resolve().parent / "csrc" / "fma_peak.cpp"
    return load_extension(f"swiftserve_fma_peak_{_build_tag()}", [source])


def _rate(mod, iters: int, threads: int, dtype: str) -> tuple[float, float]:
    """(GFLOP/s, seconds) of one run of ``iters`` iterations on ``threads`` threads."""
    got = getattr(mod, LOOPS[dtype])(iters, threads)
    if not got:
        raise RuntimeError("this CPU (or the build's -march=native) has no AVX-512-BF16: no bf16 dot-product peak")
    seconds, _checksum = got
    return FLOP_PER_ITER[dtype] * iters * threads / seconds / 1e9, seconds


def measure(threads: int, seconds: float = 0.3, trials: int = 5, dtype: str = "float32") -> float:
    """Best-of-``trials`` rate in GFLOP/s with ``threads`` threads running together: float32 FMAs,
    or bfloat16 dot products (vdpbf16ps; raises where the CPU has none)."""
    mod = _module()
    iters = 1 << 16
    while True:                                   # calibrate: one trial lasts about `seconds`
        _, elapsed = _rate(mod, iters, threads, dtype)
        if elapsed >= seconds / 4:
            break
        iters *= 4
    iters = int(iters * seconds / elapsed)
    return max(_rate(mod, iters, threads, dtype)[0] for _ in range(trials))


def read_bandwidth(threads: int, trials: int = 5, gib: float = 1.0) -> float:
    """Best-of-``trials`` GB/s of reading a ``gib`` GiB float32 tensor once (``sum``)."""
    import time

    import torch

    torch.set_num_threads(threads)
    x = torch.ones(int(gib * (1 << 30)) // 4, dtype=torch.float32)
    best = 0.0
    for _ in range(trials + 1):                  # the first pass also faults the pages in
        t = time.perf_counter()
        x.sum()
        best = max(best, x.numel() * 4 / (time.perf_counter() - t) / 1e9)
    return best


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=0.3, help="length of one trial")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--dtype", choices=tuple(LOOPS), default="float32",
                    help="float32: FMAs; bfloat16: the bf16 dot-product instruction (AVX-512-BF16)")
    ap.add_argument("--bandwidth", action="store_true", help="measure the memory read bandwidth instead (GB/s)")


def main(args: argparse.Namespace) -> int:
    if args.threads < 1 or args.seconds <= 0 or args.trials < 1:
        raise UsageError("--threads and --trials must be >= 1 and --seconds > 0")
    if args.bandwidth:
        print(f"memory read bandwidth, {args.threads} thread(s): {read_bandwidth(args.threads, args.trials):.1f} GB/s")
        return 0
    try:
        peak = measure(args.threads, args.seconds, args.trials, args.dtype)
    except RuntimeError as exc:
        print(f"cpu_peak: {exc}", file=sys.stderr)
        return 2
    what = "FMA" if args.dtype == "float32" else "dot-product (vdpbf16ps)"
    print(f"{args.dtype} {what} peak, {args.threads} thread(s): {peak:.1f} GFLOP/s")
    return 0
