"""Profile the reference engine in-process on one of the serving workloads (no HTTP).

    python -m benchmarks engine profile --workload decode_128_128 --prompts 16 --out results/perf/profiles

Runs the workload once to warm up, then once under ``torch.profiler`` and writes the
top operators by self CPU time (``<workload>[-swiftkv].txt``) plus the step figures
(prefill / decode step medians, tokens per second) as JSON. Prompts are random token
ids of the workload's input length, every request ``ignore_eos`` with the workload's
output length, all submitted at once (the batched case the issue measures).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

from benchmarks.lib.profiling import torch_ops
from benchmarks.lib.workloads import ENGINE, WORKLOADS



def make_engine(model: str, swiftkv: bool, **kw):
    from refengine.config import EngineConfig
    from refengine.engine import LLMEngine

    return LLMEngine(EngineConfig(model=model, swiftkv=swiftkv, max_model_len=2048, **kw))


def run_once(eng, n_in: int, n_out: int, prompts: int, seed: int = 0) -> dict:
    """Submit ``prompts`` requests at once and step to the end; per-step wall times by kind."""
    from refengine.sampling_params import SamplingParams

    # Prompts depend on the workload too: otherwise two workloads with one seed share leading
    # tokens, and an engine with prefix caching would reuse the blocks of the earlier run.
    rng = random.Random(f"{seed}-{n_in}-{n_out}-{prompts}")
    vocab = eng.spec.vocab_size
    params = SamplingParams(max_tokens=n_out, temperature=0, ignore_eos=True)
    for i in range(prompts):
        eng.add_request(f"p{seed}-{i}", [rng.randrange(100, vocab) for _ in range(n_in)], params)
    steps = {"prefill": [], "decode": []}
    t0 = time.perf_counter()
    while eng.has_unfinished():
        sched = eng.scheduler
        kind = "decode" if not sched.waiting and all(r.prefilled for r in sched.running) else "prefill"
        s = time.perf_counter()
        eng.step()
        steps[kind].append(time.perf_counter() - s)
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "total_tok_s": prompts * (n_in + n_out) / wall, "out_tok_s": prompts * n_out / wall,
            "prefill_steps": len(steps["prefill"]), "decode_steps": len(steps["decode"]),
            "decode_step_median_ms": 1e3 * statistics.median(steps["decode"]) if steps["decode"] else None,
            "prefill_step_median_ms": 1e3 * statistics.median(steps["prefill"]) if steps["prefill"] else None}


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default="default")
    ap.add_argument("--workload", choices=sorted(ENGINE), default="decode_128_128")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--swiftkv", action="store_true", help="serve the checkpoint with SwiftKV on")
    ap.add_argument("--dtype", default="auto", help="the engine's dtype (auto: float32 on CPU), e.g. bfloat16")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--out", default="results/perf/profiles")
    ap.add_argument("--rows", type=int, default=25)


def main(args: argparse.Namespace) -> int:
    import torch

    from modelkit.models import resolve_model

    model = str(resolve_model(args.model))
    n_in, n_out = WORKLOADS[args.workload][:2]
    eng = make_engine(model, args.swiftkv, dtype=args.dtype, torch_threads=args.threads)
    run_once(eng, n_in, min(n_out, 4), min(args.prompts, 4), seed=99)          # warm-up
    figures, ops = torch_ops(lambda: run_once(eng, n_in, n_out, args.prompts))
    table = ops.table(sort_by="self_cpu_time_total", row_limit=args.rows)
    name = args.workload + ("-swiftkv" if args.swiftkv else "") + ("" if args.dtype == "auto" else f"-{args.dtype}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    figures.update(command=args.command,
                   workload=args.workload, prompts=args.prompts, swiftkv=args.swiftkv, model=args.model, dtype=args.dtype,
                   torch=torch.__version__, threads=torch.get_num_threads(), note="wall times include profiler overhead")
    (out / f"{name}.txt").write_text(json.dumps(figures, indent=1) + "\n\n" + table + "\n")
    (out / f"{name}.json").write_text(json.dumps(figures, indent=1) + "\n")
    print(json.dumps(figures, indent=1))
    print(table)
    return 0
