"""ZACK attention speed: decode and prefill attention time vs compression rate, side by side.

Times one cache slot's ``attend`` (the engine's own code: ZACK's query map, paged
attention over the compressed K/V of the pool, output in the compressed V space) at each
rate, against the uncompressed slot (rate 0, no ZACK), on the attention path ``--kernels``
picks (``auto``: the C++ paged kernels on CPU when they build, as the engine serves;
``torch``: gather + SDPA). Ranks (``--ranks``): ``uniform`` (every head the same size),
``ragged`` (synthetic adaptive-like sizes: heads spread +-30% around the uniform size, total
kept, so widths are not multiples of 16) or ``adaptive`` (ZACK's per-head ranks planned from
the singular values of ``--calibration DIR``'s zack.json, cache slot ``--slot``). Random
data and random orthogonal maps: speed does not depend on the values. Rates are
interleaved round by round so machine drift hits all alike; medians and per-round
ratios are reported.

- decode: ``--batch`` sequences with ``--context`` cached tokens each, one query each;
- prefill: one chunk of ``--prefill`` tokens attending causally to itself.

    python -m benchmarks kernel zack_attention --out results/zack/speed.json
    python -m benchmarks kernel zack_attention --shape llama8b --device cuda --dtype bfloat16   # on a GPU host
    python -m benchmarks kernel zack_attention --ranks adaptive --calibration DIR --rates 0 0.5 --out ...

Writes JSON, a markdown table and a plot (``--out``; ``.md`` / ``.png`` next to it).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from pathlib import Path

import torch

from benchmarks.lib.records import UsageError, timed

SHAPES = {"smollm2": (9, 3, 64), "llama8b": (32, 8, 128)}       # query heads, KV heads, head_dim


def plan_ranks(args, rate: float) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Per-KV-head (K, V) sizes of the benchmarked slot at ``rate`` (see ``--ranks``)."""
    _, kvh, d = SHAPES[args.shape]
    r = max(1, d - round(rate * d))
    if args.ranks == "uniform":
        return (r,) * kvh, (r,) * kvh
    if args.ranks == "ragged":                  # +-30% around r, same total, never past [1, d]
        spread = [round(r * (0.7 + 0.6 * h / max(1, kvh - 1))) for h in range(kvh)]
        spread[-1] += r * kvh - sum(spread)
        k = tuple(min(d, max(1, x)) for x in spread)
        return k, k[::-1]
    import numpy as np

    from refengine.kv.methods.zack import ranks as zack_ranks

    slots = json.loads((Path(args.calibration) / "zack.json").read_text())["slots"]
    s_qk = np.array([s["s_qk"] for s in slots], dtype=np.float64)
    s_vo = np.array([s["s_vo"] for s in slots], dtype=np.float64)
    if s_qk.shape[1:] != (kvh, d):
        raise SystemExit(f"--calibration is for {s_qk.shape[1]} KV heads x {s_qk.shape[2]} dims, "
                         f"--shape {args.shape} has {kvh} x {d}")
    k, v, _ = zack_ranks.adaptive(s_qk, s_vo, rate)
    return tuple(int(x) for x in k[args.slot]), tuple(int(x) for x in v[args.slot])


def build_slot(rate: float, args, blocks: int, dtype, device):
    from refengine.kv.cache import KVCache
    from refengine.kv.spec import CacheSpec, ModelFacts
    from refengine.kv.methods.zack.ops import ZackRotate

    heads, kvh, d = SHAPES[args.shape]
    facts = ModelFacts("/bench", 1, heads, kvh, d, torch.empty((), dtype=dtype).element_size(), None, 1)
    group = CacheSpec.for_model(facts).groups[0]
    if rate > 0:
        k_dims, v_dims = plan_ranks(args, rate)
        group = group.with_(k_dims=k_dims, v_dims=v_dims)
    kv = KVCache(CacheSpec((group,), (0,)), [], blocks, args.block_size, dtype, device)
    slot = kv.slots[0]
    if rate > 0:
        m = torch.linalg.qr(torch.randn(kvh, d, d, dtype=torch.float64))[0]
        slot.transform = ZackRotate(group, m, m, device, dtype)
    return slot, group


def workload(kind: str, args, group, device, dtype, kernel):
    from refengine.attention import build_attn_batch, slot_mapping

    heads, kvh, d = SHAPES[args.shape]
    bs = args.block_size
    if kind == "decode":
        per = -(-args.context // bs)
        chunks = [(args.context - 1, 1, list(range(i * per, (i + 1) * per))) for i in range(args.batch)]
        fill = [(0, args.context, t) for _, _, t in chunks]
    else:
        per = -(-args.prefill // bs)
        chunks = fill = [(0, args.prefill, list(range(per)))]
    slots = slot_mapping(fill, bs, device)
    n = slots.numel()
    k = torch.randn(n, kvh, d, dtype=dtype, device=device)
    v = torch.randn(n, group.v_width, dtype=dtype, device=device)
    q = torch.randn(sum(c[1] for c in chunks), heads, d, dtype=dtype, device=device)
    return slots, k, v, q, build_attn_batch(chunks, bs, device, decode_kernel=kernel, prefill_kernel=kernel)


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--shape", choices=sorted(SHAPES), default="smollm2")
    ap.add_argument("--rates", type=float, nargs="+", default=[0.0, 0.25, 0.5, 0.75])
    ap.add_argument("--ranks", choices=["uniform", "ragged", "adaptive"], default="uniform")
    ap.add_argument("--calibration", default=None, help="--ranks adaptive: directory with zack.json")
    ap.add_argument("--slot", type=int, default=0, help="--ranks adaptive: cache slot whose ranks are used")
    ap.add_argument("--kernels", choices=["auto", "cpp", "torch"], default="auto",
                    help="attention path: the C++ paged kernels (CPU) or gather + SDPA")
    ap.add_argument("--batch", type=int, default=16, help="decode: sequences")
    ap.add_argument("--context", type=int, default=2048, help="decode: cached tokens per sequence")
    ap.add_argument("--prefill", type=int, default=2048, help="prefill: tokens of the chunk")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=15, help="timed rounds (after 2 warm-ups)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="write JSON here (+ .md table and .png plot next to it)")


def main(args: argparse.Namespace) -> int:
    if args.ranks == "adaptive" and not args.calibration:
        raise UsageError("--ranks adaptive needs --calibration DIR")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    from refengine.paged_kernel import resolve_decode_kernel

    kernel = resolve_decode_kernel(args.kernels, device)        # one module: decode and prefill
    blocks = max(args.batch * -(-args.context // args.block_size), -(-args.prefill // args.block_size)) + 1
    rows = []
    for kind in ("decode", "prefill"):
        cases = {}
        for rate in args.rates:
            slot, group = build_slot(rate, args, blocks, dtype, device)
            slots, k, v, q, batch = workload(kind, args, group, device, dtype, kernel)
            slot.write(slots, k, v)
            cases[rate] = (slot, q, batch, group)
        times = {r: [] for r in args.rates}
        for rnd in range(args.repeats + 2):
            for r, (slot, q, batch, _) in cases.items():
                t = timed(lambda: slot.attend(q, batch, 0.125))
                if rnd >= 2:
                    times[r].append(t)
        for r in args.rates:
            ratios = [a / b for a, b in zip(times[r], times[args.rates[0]])]
            g = cases[r][3]
            row = {"kind": kind, "rate": r, "k_dims": list(g.k_dims), "v_dims": list(g.v_dims),
                   "median_ms": 1000 * statistics.median(times[r]), "min_ms": 1000 * min(times[r]),
                   "ratio_vs_uncompressed": statistics.median(ratios),
                   "kv_bytes_per_token": g.device_bytes_per_token}
            rows.append(row)
            dims = f"{'/'.join(map(str, g.k_dims))} | {'/'.join(map(str, g.v_dims))}"
            print(f"{kind:8s} rate {r:4.2f} dims {dims:>15} median {row['median_ms']:9.3f} ms"
                  f"   ratio {row['ratio_vs_uncompressed']:.3f}   KV {row['kv_bytes_per_token']} B/token/layer",
                  flush=True)
    cmd = args.command
    result = {"command": cmd, "shape": dict(zip(("query_heads", "kv_heads", "head_dim"), SHAPES[args.shape])),
              "device": str(device), "dtype": args.dtype, "ranks": args.ranks,
              "attention": "C++ paged kernels" if kernel else "gather + SDPA", "torch": torch.__version__,
              "machine": f"{platform.machine()} {torch.get_num_threads()} threads",
              "decode": {"batch": args.batch, "context": args.context}, "prefill_tokens": args.prefill,
              "repeats": args.repeats, "rows": rows}
    if args.out:
        write(Path(args.out), result)
    return 0


def write(out: Path, result: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    s = result["shape"]
    md = ["# ZACK attention time vs compression rate\n", f"Command: `{result['command']}`\n",
          f"One cache slot, {s['query_heads']} query / {s['kv_heads']} KV heads, head_dim {s['head_dim']}; "
          f"{result['device']} {result['dtype']}, {result['machine']}, torch {result['torch']}; "
          f"{result.get('ranks', 'uniform')} ranks, attention on {result.get('attention', 'gather + SDPA')}. Decode: "
          f"{result['decode']['batch']} sequences x {result['decode']['context']} cached tokens, one query each; "
          f"prefill: one chunk of {result['prefill_tokens']} tokens. Medians of {result['repeats']} interleaved "
          "rounds; ratio = median of per-round ratios to the uncompressed slot (rate 0, no ZACK).\n",
          "| phase | rate | K/V dims per head | median (ms) | time ratio | KV bytes/token (this layer) |",
          "|---|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        dims = (f"{'/'.join(map(str, r['k_dims']))} / {'/'.join(map(str, r['v_dims']))}" if "k_dims" in r
                else f"{r['k_dim']}/{r['v_dim']}")           # older files: one size per slot
        md.append(f"| {r['kind']} | {r['rate']:.2f} | {dims} | {r['median_ms']:.3f} | "
                  f"{r['ratio_vs_uncompressed']:.3f} | {r['kv_bytes_per_token']} |")
    out.with_suffix(".md").write_text("\n".join(md) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for kind in ("decode", "prefill"):
        rs = [r for r in result["rows"] if r["kind"] == kind]
        ax.plot([r["rate"] for r in rs], [r["ratio_vs_uncompressed"] for r in rs], "o-", label=f"{kind} attention")
    ax.plot([0, 1], [1, 0], ":", color="grey", label="proportional to kept dims")
    ax.set_xlabel("ZACK compression rate (fraction of K/V dims removed)")
    ax.set_ylabel("time / uncompressed")
    ax.set_ylim(0, 1.3)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=120)
