"""Speculative decoding through the served stack: our worker with and without ``--speculative-config``.

    python -m benchmarks serve spec --repeats 2 --out results/spec      # -> results/spec/bench.{json,md}

Two workers (``off``: the defaults; ``on``: the same + ``--speculative-config '{"method": "suffix"}'``)
are started on their own ports and driven by the project's client (``loadtest``: streamed chat or
completions, vLLM's metric definitions, like ``vllm bench serve``), one at a time, round by round,
the order rotated every round, each run after the servers went idle (``benchmarks.lib.procs.settle``):

  prompt_heavy_1   ``--single`` requests of the prompt-heavy set (benchmarks/lib/spec_workload.py:
                   summaries with quotes, code edits, passage answers, JSON extraction, from the
                   corpus's texts), greedy, ``--max-concurrency 1``  -> decode tokens/s
  random_1         vLLM's random dataset (random token ids, 256 in / 128 out, ignore_eos), one at a
                   time: nothing in the prompt to match, though a small model's greedy continuation
                   of noise tends to loop, which the drafts then follow  -> decode tokens/s
  prompt_heavy_32  the whole set (``--load`` requests), greedy, 32 at once  -> output tokens/s
  decode_128_128   perf_suite's decode workload (random 128 in / 128 out, 32 at once)  -> output tokens/s

``--main-tree DIR`` adds a third worker, ``main``: the ``off`` worker's command run from another
checkout (``PYTHONPATH=DIR``, e.g. the main branch), on random_1 and decode_128_128: the step
without speculation must not be slower than before it existed (``off / main``).

Every round of a prompt-heavy workload draws other documents (the set's seed is the round's), so
no request repeats one whose answer already sits in the ``on`` worker's corpus of recent outputs
(it would be drafted back verbatim: a repeated workload measured that way read 2.8x where its
first round read 1.5x). Decode tokens/s of a run = sum over requests of (output tokens - 1) / sum of (last token - first
token): what a user waits for after the first token. Figures are medians over ``--repeats``
rounds of the on/off ratio measured in the same round. The ``on`` worker's
``vllm:spec_decode_*`` counters, read around its prompt_heavy_1 runs, give the mean accepted
drafted tokens per verification step. ``--identity-dtype float32`` first serves prompt_heavy_1 once
on a float32 pair and compares the greedy texts (bf16 greedy depends on the batch shape, float32
does not): ``spec_greedy_identical``; when the workers already run that dtype (``--dtype float32``)
their own prompt_heavy_1 texts of every round are compared instead, with no extra pair. Writes ``<out>/bench.json`` / ``bench.md`` and merges the
``spec_*`` keys into ``results/perf/summary.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

import httpx

from benchmarks.lib.records import ROOT, merge_json, write_json
from benchmarks.lib.procs import settle
from benchmarks.serve.suite import start, stop
from benchmarks.lib.spec_workload import prompt_heavy_set

SERVED = "smollm2"
SPEC = '{"method": "suffix"}'


def worker_argv(model: str, dtype: str, spec: bool, extra: list[str]) -> list[str]:
    argv = [sys.executable, "-m", "worker", "--model", model, "--served-model-name", SERVED, "--max-model-len", "4096",
            "--dtype", dtype, *extra]
    return argv + (["--speculative-config", SPEC] if spec else [])


def spec_counts(port: int) -> dict[str, float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    out = {}
    for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
        m = re.search(rf"^vllm:spec_decode_{name}_total\{{[^}}]*\}} ([0-9.e+]+)$", text, re.M)
        out[name] = float(m.group(1)) if m else 0.0
    return out


VARIANTS = {"prompt_heavy_1": ("off", "on"), "random_1": ("off", "on", "main"), "prompt_heavy_32": ("off", "on"),
            "decode_128_128": ("off", "main")}


def run(port: int, workload: str, args, seed: int) -> dict:
    from loadtest.datasets import random_prompts
    from loadtest.runner import RunConfig, run as run_load

    if workload in ("random_1", "decode_128_128"):
        single = workload == "random_1"
        reqs = random_prompts(args.random_prompts if single else 32, 256 if single else 128, 128, seed=seed)
        cfg = RunConfig(base_url=f"http://127.0.0.1:{port}", model=SERVED, rate=float("inf"), warmup=0, seed=seed,
                        num_requests=len(reqs), max_concurrency=1 if single else None, label=workload)
    else:
        # Other documents every round (the set's seed): a request never repeats one the "on" worker already
        # answered, whose output sits in its corpus of recent outputs and would be drafted back verbatim.
        conc = 1 if workload == "prompt_heavy_1" else 32
        reqs = prompt_heavy_set(args.load, seed=seed + (0 if conc == 1 else 1000), max_tokens=args.max_tokens)
        reqs = reqs[:args.single] if conc == 1 else reqs
        cfg = RunConfig(base_url=f"http://127.0.0.1:{port}", model=SERVED, endpoint="chat", rate=float("inf"),
                        warmup=0, seed=seed, num_requests=len(reqs), max_concurrency=conc, ignore_eos=False,
                        label=workload)
    res = asyncio.run(run_load(cfg, reqs, progress=False))
    recs = [r for r in res["requests"] if r["success"]]
    if len(recs) != len(reqs):
        raise RuntimeError(f"{workload}: {len(recs)} of {len(reqs)} requests completed: {res['errors'][:2]}")
    tokens = sum(r["output_tokens"] - 1 for r in recs)
    seconds = sum(r["e2el_s"] - r["ttft_s"] for r in recs)
    return {"decode_tok_s": tokens / seconds, "output_throughput": res["output_throughput"],
            "median_tpot_ms": res["median_tpot_ms"], "median_ttft_ms": res["median_ttft_ms"],
            "output_tokens": res["total_output_tokens"], "texts": res["generated_texts"]}


def identity_check(args, log_dir: Path) -> dict:
    """Greedy texts of prompt_heavy_1 on a float32 pair: identical with and without speculation?"""
    procs = []
    texts = {}
    try:
        for i, spec in enumerate((False, True)):
            port = args.port + 10 + i
            procs.append(start(worker_argv(args.model, args.identity_dtype, spec, []), {}, port,
                               log_dir / f"identity_{'on' if spec else 'off'}.log", args.start_timeout))
            texts[spec] = run(port, "prompt_heavy_1", args, seed=0)["texts"]
    finally:
        for p in procs:
            stop(p)
    same = [a == b for a, b in zip(texts[False], texts[True])]
    return {"dtype": args.identity_dtype, "identical": all(same), "requests": len(same), "identical_requests": sum(same)}


def report(doc: dict, runs: dict, accepted: dict, dtype: str) -> tuple[dict, list[str]]:
    """Ratios, acceptance and the summary keys from the runs (``doc`` gains them); the Markdown lines."""
    summary = {}
    table = []
    for w, by in runs.items():
        metric = "output_throughput" if w in ("prompt_heavy_32", "decode_128_128") else "decode_tok_s"
        on_runs = by.get("on", by["off"])          # decode_128_128 runs off and main only: on/off reads 1
        ratios = [on[metric] / off[metric] for on, off in zip(on_runs, by["off"])]
        same = [a["texts"] == b["texts"] for a, b in zip(on_runs, by["off"])]
        doc["runs"][w] = {"metric": metric, "ratios": ratios, "ratio_median": statistics.median(ratios),
                          "greedy_texts_identical": same,
                          **{n: [{k: v for k, v in x.items() if k != "texts"} for x in by[n]] for n in by}}
        main = None
        if "main" in by:
            off_main = [off[metric] / m[metric] for off, m in zip(by["off"], by["main"])]
            doc["runs"][w]["off_over_main"] = off_main
            main = (statistics.median(x[metric] for x in by["main"]), statistics.median(off_main))
            if w == "random_1":
                doc["runs"][w]["tpot_off_over_main"] = [off["median_tpot_ms"] / m["median_tpot_ms"]
                                                       for off, m in zip(by["off"], by["main"])]
        table.append((w, metric, statistics.median(x[metric] for x in by["off"]),
                      statistics.median(x[metric] for x in by["on"]) if "on" in by else None,
                      statistics.median(ratios) if "on" in by else None, main))
    if accepted["num_drafts"]:
        doc["acceptance"] = {**accepted, "mean_accepted_per_step": accepted["num_accepted_tokens"] / accepted["num_drafts"],
                             "acceptance_rate": accepted["num_accepted_tokens"] / accepted["num_draft_tokens"]}
    keys = {"prompt_heavy_1": "spec_single_stream_speedup", "random_1": "spec_random_dataset_ratio",
            "prompt_heavy_32": "spec_throughput_ratio_under_load"}
    for w, key in keys.items():
        if w in doc["runs"]:
            summary[key] = round(doc["runs"][w]["ratio_median"], 4)
    if "acceptance" in doc:
        summary["spec_acceptance_mean_len"] = round(doc["acceptance"]["mean_accepted_per_step"], 4)
    if "identity" in doc:
        summary["spec_greedy_identical"] = doc["identity"]["identical"]
    doc["summary"] = summary
    lines = [f"# Speculative decoding (suffix) through the served stack, {dtype}", "", f"`{doc['command']}`", "",
             f"load average {doc['loadavg_start'][0]:.2f} -> {doc['loadavg_end'][0]:.2f}", "",
             "| workload | metric | off | on | on / off (median of rounds) | main (no speculation code) | off / main |",
             "|---|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {w} | {m} | {a:.1f} | " + (f"{b:.1f} | **{r:.3f}** | " if b is not None else "| | ")
              + (f"{mn[0]:.1f} | {mn[1]:.3f} |" if mn else " | |") for w, m, a, b, r, mn in table]
    if "acceptance" in doc:
        a = doc["acceptance"]
        lines += ["", f"prompt_heavy_1 on: {a['num_drafts']:.0f} verification steps, {a['num_draft_tokens']:.0f} "
                      f"drafted tokens, {a['num_accepted_tokens']:.0f} accepted: {a['mean_accepted_per_step']:.2f} "
                      f"accepted per step (vLLM's mean acceptance length {1 + a['mean_accepted_per_step']:.2f}), "
                      f"acceptance rate {a['acceptance_rate']:.3f}"]
    if "identity" in doc:
        i = doc["identity"]
        lines += ["", f"greedy texts with and without speculation ({i['dtype']}, prompt_heavy_1): "
                      f"{i['identical_requests']} of {i['requests']} identical"]
    return summary, lines


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default="default")
    ap.add_argument("--dtype", default="auto", help="the workers' --dtype (auto: the CPU's default, swiftcommon.cpu_dtype)")
    ap.add_argument("--identity-dtype", default="float32", help="dtype of the greedy identity check ('' skips it)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--single", type=int, default=8, help="prompt-heavy requests in the single-stream runs")
    ap.add_argument("--load", type=int, default=32, help="prompt-heavy requests in the 32-concurrent run (>= 32)")
    ap.add_argument("--random-prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--workloads", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--main-tree", default=None, help="checkout whose worker is the 'main' variant (PYTHONPATH)")
    ap.add_argument("--port", type=int, default=18531)
    ap.add_argument("--start-timeout", type=float, default=900)
    ap.add_argument("--out", default="results/spec")
    ap.add_argument("--summary", default="results/perf/summary.json", help="merge the spec_* keys here ('' skips)")


def main(args: argparse.Namespace) -> int:
    from modelkit.models import resolve_model

    args.model = str(resolve_model(args.model))
    out = ROOT / args.out
    log_dir = out / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    doc: dict = {"command": args.command, "loadavg_start": os.getloadavg(), "time": time.time(),
                 "dtype": args.dtype, "spec_config": json.loads(SPEC), "runs": {}}
    # The pair's own prompt_heavy_1 texts are the identity check when it already serves that dtype.
    shared_identity = args.identity_dtype and args.identity_dtype == args.dtype and "prompt_heavy_1" in args.workloads
    if args.identity_dtype and not shared_identity:
        doc["identity"] = identity_check(args, log_dir)
        print("identity:", doc["identity"], flush=True)
    names = ("off", "on", "main") if args.main_tree else ("off", "on")
    procs, ports = {}, {}
    try:
        for i, name in enumerate(names):
            ports[name] = args.port + i
            env = {"PYTHONPATH": str(Path(args.main_tree).resolve())} if name == "main" else {}
            procs[name] = start(worker_argv(args.model, args.dtype, name == "on", []), env, ports[name],
                                log_dir / f"{name}.log", args.start_timeout)
        warm = argparse.Namespace(**{**vars(args), "random_prompts": 2})
        for name in names:                             # warm-up: two short requests on other prompts
            run(ports[name], "random_1", warm, seed=1000)
        runs = {w: {n: [] for n in names if n in VARIANTS[w]} for w in args.workloads}
        accepted = {"num_drafts": 0.0, "num_draft_tokens": 0.0, "num_accepted_tokens": 0.0}
        for w in args.workloads:
            for r in range(args.repeats):
                order = list(runs[w])
                order = order[r % len(order):] + order[:r % len(order)]      # rotated each round
                for name in order:
                    settle(procs.values())
                    before = spec_counts(ports[name]) if name == "on" and w == "prompt_heavy_1" else None
                    res = run(ports[name], w, args, seed=r)
                    if before is not None:
                        after = spec_counts(ports[name])
                        for k in accepted:
                            accepted[k] += after[k] - before[k]
                    runs[w][name].append(res)
                    write_json(log_dir / "runs.partial.json", runs)     # what a killed run leaves
                    print(f"  {w} #{r} {name}: decode {res['decode_tok_s']:.1f} tok/s, output "
                          f"{res['output_throughput']:.1f} tok/s, TPOT p50 {res['median_tpot_ms']:.1f} ms", flush=True)
    finally:
        for p in procs.values():
            stop(p)
    doc["loadavg_end"] = os.getloadavg()
    if shared_identity:
        same = [a == b for on, off in zip(runs["prompt_heavy_1"]["on"], runs["prompt_heavy_1"]["off"])
                for a, b in zip(on["texts"], off["texts"])]
        doc["identity"] = {"dtype": args.dtype, "identical": all(same), "requests": len(same),
                           "identical_requests": sum(same), "from": "prompt_heavy_1 runs of the on/off pair"}
    summary, lines = report(doc, runs, accepted, args.dtype)
    write_json(out / "bench.json", doc)
    (log_dir / "runs.partial.json").unlink(missing_ok=True)
    (out / "bench.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if args.summary:
        merge_json(ROOT / args.summary, summary)
    return 0
