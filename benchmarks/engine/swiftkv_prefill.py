"""SwiftKV prefill benchmark: TTFT and prefill throughput, baseline vs SwiftKV, side by side.

For each prompt length, one request at a time goes through the reference engine
(max_tokens=1, so the measured time is prefill + the first token = TTFT inside the
engine). Engines alternate A/B/A/B... within one run so machine drift hits both;
medians and per-pair ratios are reported. Random token prompts (seeded).

    python -m benchmarks engine swiftkv_prefill                       # SmolLM2, l=15 (50%), g=1 and g=2
    python -m benchmarks engine swiftkv_prefill --lengths 512 2048 --repeats 5 --out results/swiftkv_prefill.json
    python -m benchmarks engine swiftkv_prefill -l 15 22 --groups 1 2   # several l: every (l, g) pair

Writes JSON and a markdown table (``--out`` / ``.md``) that include the exact command.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
from pathlib import Path

import torch

from benchmarks.lib.records import timed


def build_engines(base: Path, variants: list[tuple[int, int]], tmp: Path, args) -> dict:
    from modelkit.swiftkv import write_swiftkv_checkpoint
    from refengine.config import EngineConfig
    from refengine.engine import LLMEngine

    # The same prompt runs every round: with prefix caching on, rounds after the first would
    # reuse its blocks instead of computing the prefill being measured. No per-request cap
    # either, so a prompt within --max-num-batched-tokens is one prefill step.
    common = dict(max_model_len=max(args.lengths) + 16, kv_cache_memory_gb=args.kv_gb,
                  max_num_batched_tokens=args.max_num_batched_tokens, device=args.device, dtype=args.dtype,
                  torch_threads=args.threads, enable_prefix_caching=False, long_prefill_token_threshold=0)
    engines = {"baseline": LLMEngine(EngineConfig(model=str(base), **common))}
    for l, g in variants:
        d = write_swiftkv_checkpoint(base, tmp / f"swiftkv-l{l}-g{g}", l, g)
        engines[f"swiftkv l={l} g={g}"] = LLMEngine(EngineConfig(model=str(d), **common))
    return engines


def ttft(engine, prompt: list[int]) -> float:
    from refengine.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    return timed(lambda: engine.generate([prompt], params))


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default="default", help="base model dir or 'default' (SmolLM2-135M-Instruct)")
    ap.add_argument("--num-key-value-layers", "-l", type=int, nargs="+", default=None,
                    help="SwiftKV l, one or more (default: L/2); each with every --groups size")
    ap.add_argument("--groups", type=int, nargs="+", default=[1, 2], help="AcrossKV group sizes to include")
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 4096])
    ap.add_argument("--repeats", type=int, default=5, help="timed A/B rounds per length (after 1 warm-up)")
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192,
                    help="token budget per step (default: whole prompt in one step)")
    ap.add_argument("--kv-gb", type=float, default=0.5)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="write JSON here and a markdown table next to it")


def main(args: argparse.Namespace) -> int:

    from modelkit.models import resolve_model

    base = resolve_model(args.model)
    L = json.loads((base / "config.json").read_text())["num_hidden_layers"]
    ls = args.num_key_value_layers or [L // 2]
    variants = [(l, g) for l in ls for g in args.groups]
    l = ls[0] if len(ls) == 1 else ls
    gen = torch.Generator().manual_seed(args.seed)
    with tempfile.TemporaryDirectory(dir=base.parent) as tmp:
        engines = build_engines(base, variants, Path(tmp), args)
        names = list(engines)
        rows = []
        for n in args.lengths:
            prompt = torch.randint(100, 40000, (n,), generator=gen).tolist()
            for e in engines.values():
                ttft(e, prompt)                                  # warm-up
            times = {k: [] for k in names}
            for _ in range(args.repeats):
                for k in names:
                    times[k].append(ttft(engines[k], prompt))
            base_t = times["baseline"]
            for k in names:
                ratios = [a / b for a, b in zip(times[k], base_t)]
                med = statistics.median(times[k])
                rows.append({"prompt_tokens": n, "engine": k, "median_ttft_s": med,
                             "min_ttft_s": min(times[k]), "max_ttft_s": max(times[k]),
                             "prefill_tokens_per_s": n / med, "ratio_vs_baseline_median": statistics.median(ratios),
                             "kv_bytes_per_token": engines[k].stats().kv_bytes_per_token, "times_s": times[k]})
                print(f"{n:>6} {k:<22} median TTFT {med * 1000:8.1f} ms   {n / med:8.0f} tok/s   "
                      f"ratio {statistics.median(ratios):.3f}   KV {engines[k].stats().kv_bytes_per_token:.0f} B/token",
                      flush=True)
    cmd = args.command
    result = {"command": cmd, "model": str(base), "L": L, "l": l, "device": str(engines["baseline"].runner.device),
              "dtype": str(engines["baseline"].runner.dtype), "torch": torch.__version__,
              "machine": f"{platform.machine()} {torch.get_num_threads()} threads", "rows": rows}
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2))
        md = ["# SwiftKV prefill benchmark\n", f"Command: `{cmd}`\n",
              f"Model {base.name}, L={L}, SwiftKV l={l}; device {result['device']} ({result['dtype']}), "
              f"{result['machine']}; medians of {args.repeats} alternating rounds.\n",
              "| prompt tokens | engine | median TTFT (ms) | prefill tok/s | TTFT ratio vs baseline | KV bytes/token |",
              "|---:|---|---:|---:|---:|---:|"]
        for r in rows:
            md.append(f"| {r['prompt_tokens']} | {r['engine']} | {r['median_ttft_s'] * 1000:.1f} | "
                      f"{r['prefill_tokens_per_s']:.0f} | {r['ratio_vs_baseline_median']:.3f} | {r['kv_bytes_per_token']:.0f} |")
        out.with_suffix(".md").write_text("\n".join(md) + "\n")
    return 0
