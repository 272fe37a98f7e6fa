"""GEMM timings of the engine's projections: torch's default GEMM vs oneDNN-prepacked weights (and, in
bfloat16 where the CPU has AVX-512-BF16, vs the project's bf16 GEMM, csrc/gemm_bf16.cpp).

    python -m benchmarks kernel linear --threads 2 --out results/perf/profiles/linear.json
    python -m benchmarks kernel linear --threads 2 --dtype bfloat16 --out results/perf/profiles/linear_bf16.json

For every projection shape of the model (fused QKV, o_proj, fused gate-up, down, LM head)
and each row count (decode batches and prefill chunks), times ``F.linear`` and the
prepacked module of refengine/linear.py in interleaved rounds (median of ``--repeats``),
checks that both give the same output, and prints the ratio packed / plain and the faster
path's rate in GFLOP/s (2 x rows x in x out per call) and as a fraction of this CPU's measured
peak for the dtype (benchmarks/kernel/cpu_peak.py: float32 FMAs, or bf16 dot products with
``--dtype bfloat16``); with the bf16 GEMM, its time too and its ratio to oneDNN's
(``bf16_gemm_ms``, ``bf16_gemm_vs_onednn``; the rate then counts the fastest of the three). This is what
``--packed-linear auto`` was chosen from; rerun it on another CPU before trusting the default.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

from benchmarks.kernel import cpu_peak
from benchmarks.lib.records import write_json


def shapes(spec) -> dict[str, tuple[int, int]]:
    """name -> (in_features, out_features) of each GEMM of one decoder layer, and the LM head."""
    H, d = spec.hidden_size, spec.head_dim
    q, kv = spec.num_heads * d, spec.num_kv_heads * d
    return {"qkv": (H, q + 2 * kv), "o": (q, H), "gate_up": (H, 2 * spec.intermediate_size),
            "down": (spec.intermediate_size, H), "lm_head": (H, spec.vocab_size)}


def time_pair(f, g, repeats: int) -> tuple[float, float]:
    for _ in range(2):
        f(), g()
    a, b = [], []
    for _ in range(repeats):                       # interleaved: drift hits both alike
        s = time.perf_counter(); f(); a.append(time.perf_counter() - s)
        s = time.perf_counter(); g(); b.append(time.perf_counter() - s)
    return 1e3 * statistics.median(a), 1e3 * statistics.median(b)


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default="default")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 32, 64, 256, 1024, 2048])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    ap.add_argument("--out", default=None)


def main(args: argparse.Namespace) -> int:
    import torch
    import torch.nn.functional as F

    from modelkit.models import resolve_model
    from refengine.linear import Bf16Linear, PackedLinear, make_linear
    from refengine.model_config import load_model_spec

    if args.threads:
        torch.set_num_threads(args.threads)
    spec = load_model_spec(resolve_model(args.model))
    dtype = getattr(torch, args.dtype)
    peak = cpu_peak.measure(torch.get_num_threads(), dtype=args.dtype)
    print(f"{args.dtype} peak with {torch.get_num_threads()} thread(s): {peak:.0f} GFLOP/s (benchmarks/kernel/cpu_peak.py)")
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    rows_out = []
    for name, (k, n) in shapes(spec).items():
        w = (torch.randn(n, k) / k ** 0.5).to(dtype)
        try:
            mod = PackedLinear(w, None)
        except RuntimeError as exc:
            raise SystemExit(f"oneDNN prepacking unavailable here: {exc}")
        ours = make_linear(w, None, True)
        ours = ours if isinstance(ours, Bf16Linear) else None
        for m in args.rows:
            if name == "lm_head" and m > 256:          # the head only sees rows that need logits
                continue
            x = torch.randn(m, k).to(dtype)
            for what, f in (("prepacked", mod), ("bf16 GEMM", ours)):
                if f is not None and not torch.allclose(f(x).float(), F.linear(x, w).float(), rtol=tol, atol=tol):
                    raise SystemExit(f"{name} M={m}: {what} output differs")
            plain, packed = time_pair(lambda: F.linear(x, w), lambda: mod(x), args.repeats)
            row = {"gemm": name, "in": k, "out": n, "rows": m, "plain_ms": round(plain, 4),
                   "packed_ms": round(packed, 4), "ratio": round(packed / plain, 3)}
            best = min(plain, packed)
            if ours is not None:
                packed2, bf16 = time_pair(lambda: mod(x), lambda: ours(x), args.repeats)
                row.update(bf16_gemm_ms=round(bf16, 4), bf16_gemm_vs_onednn=round(bf16 / packed2, 3))
                best = min(best, bf16)
            gflops = 2 * m * k * n / (best * 1e6)       # the fastest path's rate
            row.update(gflops=round(gflops, 1), of_peak=round(gflops / peak, 3))
            rows_out.append(row)
            extra = (f"  bf16 GEMM {row['bf16_gemm_ms']:9.3f} ms ({row['bf16_gemm_vs_onednn']:.2f}x oneDNN's)"
                     if ours is not None else "")
            print(f"{name:8s} {k:5d}x{n:<6d} rows={m:5d}  plain {plain:9.3f} ms  packed {packed:9.3f} ms  "
                  f"ratio {packed / plain:.2f}{extra}  {gflops:6.1f} GFLOP/s ({100 * gflops / peak:.0f}% of peak)",
                  flush=True)
    # Per row count, the decoder layer's GEMMs together (qkv, o, gate_up, down; not the LM head,
    # which prefill runs on a few rows): their flops over the faster paths' summed time, / peak.
    layer_share = {}
    for m in args.rows:
        rs = [r for r in rows_out if r["rows"] == m and r["gemm"] != "lm_head"]
        flops = sum(2 * m * r["in"] * r["out"] for r in rs)
        ms = sum(min(r["plain_ms"], r["packed_ms"], r.get("bf16_gemm_ms", float("inf"))) for r in rs)
        layer_share[str(m)] = round(flops / (ms * 1e6) / peak, 3)
    print("decoder-layer GEMMs as a share of the peak, by rows: " + json.dumps(layer_share))
    res = {"command": args.command,
           "model": args.model, "threads": torch.get_num_threads(), "torch": torch.__version__,
           "cpu": platform.processor() or platform.machine(), "capability": torch.backends.cpu.get_cpu_capability(),
           "repeats": args.repeats, "dtype": args.dtype, "peak_gflops": round(peak, 1),
           "layer_share_of_peak": layer_share, "rows": rows_out}
    if args.out:
        write_json(args.out, res)
    return 0
