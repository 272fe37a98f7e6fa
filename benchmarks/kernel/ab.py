"""The attention kernels of this checkout against an earlier version's, in one process, calls interleaved.

    git worktree add /tmp/base c9baf8a
    python -m benchmarks kernel ab --base-src /tmp/base/refengine/csrc --out results/models/kernel_ab.json

Both builds are loaded side by side (the earlier one under its own module name), and each
timed round calls A then B on the same inputs, so load from other processes on a shared
machine hits both alike. Cases (SmolLM2's attention shape by default): causal prefill of
``--prefill-len`` tokens with no window (the global layers' path), and decode of ``--batch``
sequences of ``--context`` tokens with no window. ``--dtype bfloat16``: bf16 pools and queries,
each side called as its own engine calls it (the base decode kernel took float32 queries:
it gets q widened, as the base engine gave it). Reports per case the median over
``--rounds`` of each side's time and the median of the per-round ratios new / base
(1.0 = no change), and checks that both sides give the same output.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from benchmarks.lib.ab import paired_ratio
from benchmarks.lib.records import write_json
from benchmarks.lib.workloads import add_attention_shape_args


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--base-src", required=True, help="csrc directory of the earlier version")
    add_attention_shape_args(ap)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--out", default="results/models/kernel_ab.json")


def main(args: argparse.Namespace) -> int:
    import torch

    from refengine.paged_kernel import build, load_extension

    torch.set_num_threads(args.threads)
    src = Path(args.base_src)
    import hashlib

    tag = hashlib.sha1(b"".join(p.read_bytes() for p in sorted(src.glob("*")))).hexdigest()[:8]
    base = load_extension(f"swiftserve_kernel_ab_base_{tag}", sorted(src.glob("*.cpp")))
    new = build().module
    H, kvh, d, bs = args.heads, args.kv_heads, args.head_dim, 16
    torch.manual_seed(0)
    n = args.prefill_len
    nblk = -(-n // bs)
    dt = getattr(torch, args.dtype)
    k_pool, v_pool = torch.randn(nblk, bs, kvh, d).to(dt), torch.randn(nblk, bs, kvh, d).to(dt)
    blocks = torch.randperm(nblk)
    q = torch.randn(n, H, d).to(dt)
    outs = [torch.empty(n, H, d), torch.empty(n, H, d)]
    B, ctx = args.batch, args.context
    per = -(-ctx // bs)
    dk, dv = torch.randn(B * per, bs, kvh, d).to(dt), torch.randn(B * per, bs, kvh, d).to(dt)
    table = torch.randperm(B * per).view(B, per)
    lens = torch.full((B,), ctx, dtype=torch.long)
    qd = torch.randn(B, kvh, H // kvh, d).to(dt)
    qd_base = qd.float()
    cases = {
        "prefill": (lambda: base.paged_prefill(q, k_pool, v_pool, blocks, 0, 0.125, outs[0]),
                    lambda: new.paged_prefill(q, k_pool, v_pool, blocks, 0, 0.125, outs[1], 0)),
        "decode": (lambda: base.paged_decode(qd_base, dk, dv, table, lens, 0.125),
                   lambda: new.paged_decode(qd, dk, dv, table, lens, 0.125, None)),
    }
    doc = {"command": args.command, "threads": args.threads, "rounds": args.rounds, "dtype": args.dtype,
           "shape": {"heads": H, "kv_heads": kvh, "head_dim": d, "block_size": bs}, "cases": {}}
    for name, (fa, fb) in cases.items():
        ra, rb = fa(), fb()
        if name == "prefill":
            ra, rb = outs
        same = float((ra - rb).abs().max())
        ta, tb = [], []
        for _ in range(5):
            fa(), fb()
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            fa()
            t1 = time.perf_counter()
            fb()
            t2 = time.perf_counter()
            ta.append(t1 - t0)
            tb.append(t2 - t1)
        doc["cases"][name] = {"base_ms": 1e3 * statistics.median(ta), "new_ms": 1e3 * statistics.median(tb),
                              "new_over_base": paired_ratio(tb, ta),
                              "max_abs_diff": same}
        print(f"{name}: base {doc['cases'][name]['base_ms']:.3f} ms, new {doc['cases'][name]['new_ms']:.3f} ms, "
              f"new/base {doc['cases'][name]['new_over_base']:.3f} (max |diff| {same:.1e})")
    write_json(args.out, doc)
    return 0
