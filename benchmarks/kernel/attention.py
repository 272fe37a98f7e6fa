"""The CPU attention kernels against PyTorch on one layer's shapes (SmolLM2 by default).

    python -m benchmarks kernel attention --out results/perf/profiles/attention_kernels.json

Prefill: a ``--prefill-len``-token prompt, causal, the kernel reading a block pool in place
against ``scaled_dot_product_attention(is_causal=True, enable_gqa=True)`` on contiguous K/V
(no gather counted: the torch path's best case); the kernel's rate is also given as a fraction
of this CPU's measured FMA peak (benchmarks/kernel/cpu_peak.py). Decode: ``--batch`` sequences of
``--context`` cached tokens in scattered blocks, one query each, through
``refengine.attention.paged_attention`` with and without the kernel (the engine's two
paths, gather included). bf16 prefill: the same prompt rounded to bf16, the bf16 dot-product
kernel (bf16 q over bf16 pools) against the float32 kernel on the same values. Medians over
``--repeats`` calls after warm-up, and the ratios; both paths' outputs are compared (max abs
difference).
"""

from __future__ import annotations

import argparse

from benchmarks.kernel import cpu_peak
from benchmarks.lib.records import median_ms, write_json
from benchmarks.lib.workloads import add_attention_shape_args


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    import torch

    add_attention_shape_args(ap)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--out", default="results/perf/profiles/attention_kernels.json")


def main(args: argparse.Namespace) -> int:
    import torch
    import torch.nn.functional as F

    from refengine.attention import build_attn_batch, paged_attention
    from refengine.kv.cache import PartKV
    from refengine.kv.spec import HeadPart
    from refengine.kv.storage import DenseStore
    from refengine.paged_kernel import build

    torch.set_num_threads(args.threads)
    kernel = build()
    H, kvh, d, bs = args.heads, args.kv_heads, args.head_dim, args.block_size
    cpu = torch.device("cpu")
    gen = torch.Generator().manual_seed(0)
    scale = d ** -0.5

    n = args.prefill_len
    nblk = -(-n // bs)
    k_pool, v_pool = torch.randn(nblk + 8, bs, kvh, d, generator=gen), torch.randn(nblk + 8, bs, kvh, d, generator=gen)
    blocks = torch.randperm(nblk + 8, generator=gen)[:nblk]
    q = torch.randn(n, H, d, generator=gen)
    out = torch.empty(n, H, d)
    k = k_pool[blocks].flatten(0, 1)[:n].transpose(0, 1).unsqueeze(0).contiguous()      # [1, kvh, n, d]
    v = v_pool[blocks].flatten(0, 1)[:n].transpose(0, 1).unsqueeze(0).contiguous()
    qt = q.transpose(0, 1).unsqueeze(0)

    def sdpa():
        return F.scaled_dot_product_attention(qt, k, v, is_causal=True, scale=scale, enable_gqa=True)

    kernel.prefill(q, k_pool, v_pool, blocks, 0, scale, out)
    prefill = {"kernel_ms": median_ms(lambda: kernel.prefill(q, k_pool, v_pool, blocks, 0, scale, out), args.repeats, 3),
               "sdpa_ms": median_ms(sdpa, args.repeats, 3),
               "max_abs_diff": float((out - sdpa()[0].transpose(0, 1)).abs().max())}

    # bf16: the same values rounded to bf16, through the bf16 dot-product kernel (bf16 q over bf16
    # pools; csrc/paged_prefill_bf16.cpp) and through the float32 kernel (q widened), alternating.
    qb, kb, vb = q.bfloat16(), k_pool.bfloat16(), v_pool.bfloat16()
    qbf, out_b = qb.float(), torch.empty(n, H, d)
    kernel.prefill(qb, kb, vb, blocks, 0, scale, out_b)
    kernel.prefill(qbf, kb, vb, blocks, 0, scale, out)
    prefill_bf16 = {"bf16_dot_ms": median_ms(lambda: kernel.prefill(qb, kb, vb, blocks, 0, scale, out_b),
                                             args.repeats, 3),
                    "float32_kernel_ms": median_ms(lambda: kernel.prefill(qbf, kb, vb, blocks, 0, scale, out),
                                                   args.repeats, 3),
                    "max_abs_diff": float((out_b - out).abs().max())}
    prefill_bf16["bf16_over_float32"] = prefill_bf16["bf16_dot_ms"] / prefill_bf16["float32_kernel_ms"]

    B, ctx = args.batch, args.context
    per = -(-ctx // bs)
    part = PartKV(HeadPart(tuple(range(kvh)), d, d), DenseStore(B * per + 8, bs, kvh, d, torch.float32, cpu),
                  DenseStore(B * per + 8, bs, kvh, d, torch.float32, cpu))
    part.k.data.normal_(generator=gen)
    part.v.data.normal_(generator=gen)
    perm = torch.randperm(B * per + 8, generator=gen).tolist()
    chunks = [(ctx - 1, 1, perm[i * per:(i + 1) * per]) for i in range(B)]
    qd = torch.randn(B, H, d, generator=gen)
    with_k = build_attn_batch(chunks, bs, cpu, decode_kernel=kernel)
    without = build_attn_batch(chunks, bs, cpu)
    decode = {"kernel_ms": median_ms(lambda: paged_attention(qd, part, with_k, scale), args.repeats, 3),
              "torch_ms": median_ms(lambda: paged_attention(qd, part, without, scale), args.repeats, 3),
              "max_abs_diff": float((paged_attention(qd, part, with_k, scale)
                                     - paged_attention(qd, part, without, scale)).abs().max())}
    prefill["kernel_over_sdpa"] = prefill["kernel_ms"] / prefill["sdpa_ms"]
    # causal: n(n+1)/2 (query, key) pairs per head, each a d-long dot product and a d-long axpy
    prefill["kernel_gflops"] = 4 * H * d * n * (n + 1) / 2 / (prefill["kernel_ms"] * 1e6)
    peak = cpu_peak.measure(args.threads)
    prefill["kernel_of_fma_peak"] = prefill["kernel_gflops"] / peak
    decode["kernel_over_torch"] = decode["kernel_ms"] / decode["torch_ms"]
    doc = {"command": args.command, "threads": args.threads, "torch": torch.__version__,
           "fma_peak_gflops": peak,
           "shape": {"heads": H, "kv_heads": kvh, "head_dim": d, "block_size": bs},
           "prefill": {"tokens": n, **prefill}, "prefill_bf16": {"tokens": n, **prefill_bf16},
           "decode": {"batch": B, "context": ctx, **decode}}
    write_json(args.out, doc)
    print(f"prefill {n} tokens: kernel {prefill['kernel_ms']:.2f} ms ({prefill['kernel_gflops']:.0f} GFLOP/s, "
          f"{100 * prefill['kernel_of_fma_peak']:.0f}% of the {peak:.0f} GFLOP/s FMA peak), "
          f"SDPA {prefill['sdpa_ms']:.2f} ms "
          f"({prefill['kernel_over_sdpa']:.2f}x); decode {B} x {ctx}: kernel {decode['kernel_ms']:.3f} ms, "
          f"gather + SDPA {decode['torch_ms']:.3f} ms ({decode['kernel_over_torch']:.2f}x); bf16 prefill: "
          f"dot-product kernel {prefill_bf16['bf16_dot_ms']:.2f} ms vs the float32 kernel on the same values "
          f"{prefill_bf16['float32_kernel_ms']:.2f} ms ({prefill_bf16['bf16_over_float32']:.2f}x)")
    return 0
