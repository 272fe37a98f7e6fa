"""This CPU's measured float32 FMA peak, the yardstick for the GFLOP/s the benchmarks print.

    python benchmarks/cpu_peak.py --threads 2

Builds (once, cached like the engine's kernels) a loop of independent fused multiply-adds on
16-float vectors: 16 accumulator chains per thread, enough to keep two FMA pipes busy through
their latency, no memory traffic. ``--threads`` threads run it at once for ``--seconds`` per
trial; the best of ``--trials`` is the peak (2 flops per lane per FMA). GEMM and attention
rates divided by this are the fractions of peak quoted in results/perf/README.md.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# GCC vector extensions: the same style as refengine/csrc; -march=native picks the widest FMA.
_SOURCE = r"""
#include <torch/extension.h>
#include <omp.h>

typedef float v16 __attribute__((vector_size(64)));

// Returns {GFLOP/s, checksum}; the checksum keeps the chains alive through the optimiser.
std::vector<double> fma_peak(int64_t iters, int64_t threads) {
    double sink = 0.0;
    double t0 = omp_get_wtime();
    #pragma omp parallel num_threads(threads) reduction(+ : sink)
    {
        v16 acc[16];
        v16 x, y;
        for (int l = 0; l < 16; ++l) { x[l] = 0.999999f; y[l] = 1e-7f; }
        for (int j = 0; j < 16; ++j)
            for (int l = 0; l < 16; ++l) acc[j][l] = 1.0f + 0.001f * (j + l + omp_get_thread_num());
        for (int64_t it = 0; it < iters; ++it) {
            #pragma GCC unroll 16
            for (int j = 0; j < 16; ++j) acc[j] = acc[j] * x + y;    // one FMA per chain
        }
        for (int j = 0; j < 16; ++j)
            for (int l = 0; l < 16; ++l) sink += acc[j][l];
    }
    double dt = omp_get_wtime() - t0;
    return {2.0 * 16 * 16 * (double)iters * threads / dt / 1e9, sink};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("fma_peak", &fma_peak); }
"""


def _module():
    from torch.utils import cpp_extension

    from refengine.paged_kernel import _build_tag        # keyed by the CPU's flags (-march=native)

    tag = hashlib.sha1((_SOURCE + _build_tag()).encode()).hexdigest()[:8]
    return cpp_extension.load_inline(
        name=f"swiftserve_fma_peak_{tag}", cpp_sources=[_SOURCE],
        extra_cflags=["-O3", "-march=native", "-fopenmp"], extra_ldflags=["-fopenmp"], verbose=False)


def measure(threads: int, seconds: float = 0.3, trials: int = 5) -> float:
    """Best-of-``trials`` FMA rate in GFLOP/s with ``threads`` threads running together."""
    mod = _module()
    iters = 1 << 16
    while True:                                   # calibrate: one trial lasts about `seconds`
        gflops, _ = mod.fma_peak(iters, threads)
        elapsed = 2.0 * 16 * 16 * iters * threads / (gflops * 1e9)
        if elapsed >= seconds / 4:
            break
        iters *= 4
    iters = int(iters * seconds / elapsed)
    return max(mod.fma_peak(iters, threads)[0] for _ in range(trials))


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
