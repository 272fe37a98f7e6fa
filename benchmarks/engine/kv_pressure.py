"""Throughput under memory pressure: the same device KV budget for every KV method.

Every configuration gets the same ``--pool-mb`` of device memory for its KV cache
(the engine sizes the block pool from it after a method's fixed reservations, e.g.
ZipCache's full-precision window), then serves the same burst of ``--requests``
requests of ``--prompt`` random tokens, ``--gen`` greedy tokens each, in one
in-process engine (no HTTP: this measures the cache, not the server). The budget is
chosen so the uncompressed baseline cannot hold every request: it queues (and may
preempt), while a method that stores fewer device bytes per token, or frees blocks
after the prompt (eviction), runs more sequences at once.

Reported per configuration: blocks in the pool, peak concurrent sequences (running
requests after a step, the scheduler's own count), mean running, preemptions, wall
time, generated and total tokens per second, peak device KV bytes in use, and the
ratio of peak concurrency to the baseline's (the first configuration).

    python -m benchmarks engine kv_pressure --methods '{"baseline": {}, "kcache": {"kcache": {"top_n": 64}}}' \
        --pool-mb 256 --out results/kv_methods/pressure.json

Writes JSON and a markdown table (``.md`` next to ``--out``).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import time
from pathlib import Path


def run_one(model: str, methods: dict, args) -> dict:
    from refengine.config import EngineConfig
    from refengine.engine import LLMEngine
    from refengine.sampling_params import SamplingParams

    eng = LLMEngine(EngineConfig(model=model, max_model_len=args.prompt + args.gen + 16,
                                 kv_cache_memory_gb=args.pool_mb / 1024, max_num_seqs=args.max_num_seqs,
                                 max_num_batched_tokens=args.batched_tokens, torch_threads=args.threads,
                                 kv_methods=methods))
    rng = random.Random(args.seed)
    vocab = eng.spec.vocab_size
    params = SamplingParams(max_tokens=args.gen, temperature=0, ignore_eos=True)
    for i in range(args.requests):
        eng.add_request(f"r{i}", [rng.randrange(100, vocab) for _ in range(args.prompt)], params)
    running, used_bytes, steps = [], [], 0
    t0 = time.perf_counter()
    while eng.has_unfinished():
        eng.step()
        st = eng.stats()
        running.append(st.num_running)
        used_bytes.append(st.extra["kv_bytes_used"])
        steps += 1
    wall = time.perf_counter() - t0
    st = eng.stats()
    gen = args.requests * args.gen
    return {"methods": methods, "kv_blocks": st.kv_blocks_total, "kv_bytes_per_token": st.kv_bytes_per_token,
            "kv_host_bytes_per_token": st.extra["kv_host_bytes_per_token"],
            "kv_reserved_bytes": st.extra["kv_reserved_bytes"], "pool_bytes": st.kv_bytes_total,
            "peak_concurrent": max(running), "mean_running": sum(running) / len(running), "steps": steps,
            "preemptions": st.num_preemptions, "wall_s": wall, "gen_tokens_per_s": gen / wall,
            "total_tokens_per_s": (gen + args.requests * args.prompt) / wall,
            "peak_kv_bytes_used": max(used_bytes),
            "method_stats": {k: v for k, v in st.extra.items() if not k.startswith(("kv_", "swiftkv"))}}


def table(results: dict, args) -> str:
    base = next(iter(results.values()))
    lines = [f"Pool: {args.pool_mb} MiB of device KV memory for every configuration; {args.requests} requests x "
             f"{args.prompt} prompt tokens + {args.gen} generated; max_num_seqs={args.max_num_seqs}, "
             f"max_num_batched_tokens={args.batched_tokens}, {args.threads} thread(s).\n",
             "| configuration | device B/token | host B/token | blocks | peak concurrent | x baseline | "
             "mean running | preemptions | wall s | gen tok/s | total tok/s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['kv_bytes_per_token']:.0f} | {r['kv_host_bytes_per_token']:.0f} | "
                     f"{r['kv_blocks']} | {r['peak_concurrent']} | "
                     f"{r['peak_concurrent'] / base['peak_concurrent']:.2f} | {r['mean_running']:.1f} | "
                     f"{r['preemptions']} | {r['wall_s']:.1f} | {r['gen_tokens_per_s']:.1f} | "
                     f"{r['total_tokens_per_s']:.0f} |")
    return "\n".join(lines)


def add_cli_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="default", help="model dir or known name (default: %(default)s)")
    p.add_argument("--methods", required=True, metavar="JSON",
                   help='label -> --kv-methods object; the first is the baseline, e.g. \'{"baseline": {}, ...}\'')
    p.add_argument("--pool-mb", type=float, default=256.0, help="device KV budget per configuration (MiB)")
    p.add_argument("--requests", type=int, default=24)
    p.add_argument("--prompt", type=int, default=1024)
    p.add_argument("--gen", type=int, default=64)
    p.add_argument("--max-num-seqs", type=int, default=24)
    p.add_argument("--batched-tokens", type=int, default=512)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="JSON output (a .md table is written next to it)")


def main(args: argparse.Namespace) -> int:

    from modelkit.models import resolve_model
    from refengine.kv import registry

    model = str(resolve_model(args.model))
    configs = json.loads(args.methods)
    for name, methods in configs.items():          # refuse bad methods before any engine starts
        reason = registry.check(methods, model)
        if reason:
            raise SystemExit(f"kv_pressure: {name}: {reason}")
    results = {}
    for name, methods in configs.items():
        results[name] = run_one(model, methods, args)
        r = results[name]
        print(f"{name}: peak {r['peak_concurrent']} concurrent, {r['gen_tokens_per_s']:.1f} gen tok/s, "
              f"{r['preemptions']} preemptions, {r['wall_s']:.1f}s", flush=True)
    base = next(iter(results.values()))
    for r in results.values():
        r["concurrency_ratio"] = r["peak_concurrent"] / base["peak_concurrent"]
        r["throughput_ratio"] = r["gen_tokens_per_s"] / base["gen_tokens_per_s"]
    md = table(results, args)
    print(md)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        import torch

        meta = {"command": args.command,
                "model": model, "torch": torch.__version__, "machine": platform.processor() or platform.machine(),
                "setup": {k: v for k, v in vars(args).items() if k not in ("methods", "out")}}
        out.write_text(json.dumps({**meta, "results": results}, indent=2))
        out.with_suffix(".md").write_text(md + "\n")
    return 0
