"""The figures of results/api/summary.json, measured in one run.

1. ``echo_prefill_overhead_ratio``: prefill time of one ``--tokens``-token prompt with
   prompt logprobs (what ``echo`` + ``logprobs: 1`` asks the engine for: the LM head and
   a log-softmax on every prompt row, in slices) / the same prefill without, in the
   reference engine (one step computes the whole prompt and samples; prefix caching off;
   the two kinds interleaved, medians of ``--repeats``). ``--swiftkv-model`` adds the same
   ratio for a SwiftKV checkpoint, where the prompt rows also run the later layers.
2. ``lm_eval_loglikelihood_matches``: lm-evaluation-harness (``local-completions``,
   offline, benchmarks/lib/data/lm_eval) against a gateway in front of a worker, every
   loglikelihood compared with the engine's own ``score()`` of the same token ids:
   true when the largest difference is below 1e-3 nats per token.
3. ``endpoints``: the POST/GET paths that answered 200 through the gateway in this run.

    python -m benchmarks quality api_scoring --out results/api
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.lib.records import merge_json, write_json


def prefill_times(model: str, tokens: int, repeats: int) -> dict:
    from refengine.config import EngineConfig
    from refengine.engine import LLMEngine
    from refengine.sampling_params import SamplingParams

    eng = LLMEngine(EngineConfig(model=model, max_model_len=tokens + 8, enable_prefix_caching=False,
                                 max_num_batched_tokens=tokens, long_prefill_token_threshold=0,
                                 num_kv_blocks=-(-(tokens + 8) // 16) + 1))
    vocab = eng.spec.vocab_size
    kinds = {"plain": SamplingParams(max_tokens=1, temperature=0),
             "echo": SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=1)}
    times: dict[str, list[float]] = {k: [] for k in kinds}
    cpu: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(repeats + 1):                      # round 0 warms up
        for kind in (("plain", "echo") if r % 2 else ("echo", "plain")):
            prompt = [(7919 * (i + 31 * r) + (kind == "echo")) % (vocab - 100) + 50 for i in range(tokens)]
            eng.add_request(f"{kind}-{r}", prompt, kinds[kind])
            t, c = time.perf_counter(), time.process_time()
            outs = eng.step()                          # the whole prompt in one step, then the sample
            dt, dc = time.perf_counter() - t, time.process_time() - c
            assert outs and outs[0].finished and (outs[0].prompt_logprobs is not None) == (kind == "echo")
            if r:
                times[kind].append(dt)
                cpu[kind].append(dc)
    med = {k: statistics.median(v) for k, v in times.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    # CPU seconds of the process (all its threads): a cross-check that other jobs on a shared
    # machine inflate less than wall time.
    return {"plain_ms": 1e3 * med["plain"], "echo_ms": 1e3 * med["echo"], "ratio": med["echo"] / med["plain"],
            "cpu_ratio": med_cpu["echo"] / med_cpu["plain"],
            "runs_ms": {k: [round(1e3 * x, 2) for x in v] for k, v in times.items()}}


def served_checks(model: str, tmp: Path) -> dict:
    from benchmarks.lib.lm_eval import loglikelihood_pairs, run_lm_eval
    from benchmarks.lib.procs import free_port, start, stop_groups

    from refengine.config import EngineConfig
    from refengine.engine import LLMEngine

    wp, gp = free_port(), free_port()
    procs = [start([sys.executable, "-m", "worker", "--model", model, "--served-model-name", "smol",
                    "--max-model-len", "1024"], {}, wp, tmp / "worker.log", 600)]
    try:
        procs.append(start([sys.executable, "-m", "gateway", "--workers", f"http://127.0.0.1:{wp}"], {}, gp,
                           tmp / "gateway.log", 60))
        url = f"http://127.0.0.1:{gp}"
        results, lm = run_lm_eval(url, "smol", model, tmp)
        pairs = loglikelihood_pairs(results, lm)
        eng = LLMEngine(EngineConfig(model=model, max_model_len=1024))
        scores = eng.score([(ctx, cont) for _, _, ctx, cont in pairs])
        diffs = [abs(ll - sum(s[0] for s in sc)) / len(cont) for (ll, _, _, cont), sc in zip(pairs, scores)]
        endpoints = probe_endpoints(url)
    finally:
        stop_groups(procs, 60)
    return {"lm_eval_requests": len(pairs), "lm_eval_max_abs_diff_per_token": max(diffs),
            "lm_eval_acc": results["results"]["swiftserve_mc"]["acc,none"], "endpoints": endpoints}


def probe_endpoints(url: str) -> list[str]:
    msgs = [{"role": "user", "content": "Hi"}]
    posts = {"/v1/completions": {"model": "smol", "prompt": "Hi", "max_tokens": 0, "echo": True, "logprobs": 1},
             "/v1/chat/completions": {"model": "smol", "messages": msgs, "max_tokens": 2, "prompt_logprobs": 1},
             "/v1/responses": {"model": "smol", "input": "Hi", "max_output_tokens": 2},
             "/tokenize": {"model": "smol", "messages": msgs},
             "/detokenize": {"model": "smol", "tokens": [1, 2, 3]}}
    served = [p for p, body in posts.items() if httpx.post(url + p, json=body, timeout=120).status_code == 200]
    return served + [p for p in ("/v1/models", "/health", "/metrics") if httpx.get(url + p).status_code == 200]


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default="default", help="served model (modelkit name or directory)")
    ap.add_argument("--swiftkv-model", default="SmolLM2-135M-Instruct-SwiftKV",
                    help="a SwiftKV checkpoint for the SwiftKV ratio ('' skips it)")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--skip-served", action="store_true", help="only the prefill ratios")
    ap.add_argument("--out", default="results/api")


def main(args: argparse.Namespace) -> int:
    from modelkit.models import resolve_model

    model = str(resolve_model(args.model))
    doc: dict = {"command": args.command, "tokens": args.tokens, "repeats": args.repeats,
                 "loadavg_before": os.getloadavg()}
    doc["prefill"] = prefill_times(model, args.tokens, args.repeats)
    p = doc["prefill"]
    print(f"prefill {args.tokens} tokens: {p['plain_ms']:.1f} ms plain, {p['echo_ms']:.1f} ms with prompt "
          f"logprobs: ratio {p['ratio']:.3f} (CPU time {p['cpu_ratio']:.3f})", flush=True)
    if args.swiftkv_model:
        doc["prefill_swiftkv"] = p = prefill_times(str(resolve_model(args.swiftkv_model)), args.tokens, args.repeats)
        print(f"SwiftKV: {p['plain_ms']:.1f} ms plain, {p['echo_ms']:.1f} ms: ratio {p['ratio']:.3f} "
              f"(CPU time {p['cpu_ratio']:.3f})", flush=True)
    out = Path(args.out)
    summary = {}
    summary["echo_prefill_overhead_ratio"] = round(doc["prefill"]["ratio"], 3)
    if args.swiftkv_model:
        summary["echo_prefill_overhead_ratio_swiftkv"] = round(doc["prefill_swiftkv"]["ratio"], 3)
    if not args.skip_served:
        with tempfile.TemporaryDirectory() as tmp:       # process logs and lm-eval's task files
            doc["served"] = served_checks(model, Path(tmp))
        print(f"lm-eval: {doc['served']['lm_eval_requests']} loglikelihoods, max |diff| "
              f"{doc['served']['lm_eval_max_abs_diff_per_token']:.2e} nats/token; endpoints "
              f"{doc['served']['endpoints']}", flush=True)
        summary["lm_eval_loglikelihood_matches"] = doc["served"]["lm_eval_max_abs_diff_per_token"] < 1e-3
        summary["endpoints"] = doc["served"]["endpoints"]
    doc["loadavg_after"] = os.getloadavg()
    write_json(out / "api_scoring.json", doc)
    print(json.dumps(merge_json(out / "summary.json", summary), indent=1))
    return 0
