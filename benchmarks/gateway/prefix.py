"""Prefix-aware vs JSQ routing on a shared-prefix workload, with real processes.

Workload (loadtest.datasets.shared_prefix_prompts): ``--prefixes`` system prompts of
``--prefix-len`` tokens, each request one of them plus a unique ``--suffix-len``-token
question, Poisson arrivals at ``--rate``. Workers: ``--workers`` stub workers
(benchmarks/lib/stub_worker.py) that model a compute-bound engine with a prefix cache:
one prefill at a time, ``--prefill-per-token`` seconds per *uncached* prompt token, an
LRU cache of ``--cache-tokens`` tokens (smaller than the 8 prompts together, as a KV
cache that also holds other work). For each policy, fresh workers (cold caches) and a
fresh gateway; the client is the load generator (loadtest.runner, vLLM's metric
definitions). Per-worker request counts come from the workers themselves.

    python -m benchmarks gateway prefix --out results/gateway/prefix.json

``--hot-share F`` sends a share F of the requests to the first system prompt (the rest
spread over all of them): a hot prefix, where the load bound has to keep one worker
from taking all of it.

Reports TTFT p50/p99 per policy, the prefix/JSQ TTFT p50 ratio, max/mean requests per
worker and the workers' prefix-cache hit rate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

import httpx
import numpy as np

from benchmarks.gateway.routing import STUB_WORKER, spawn
from benchmarks.lib.procs import free_port, wait_healthy

from loadtest.datasets import RequestSpec
from loadtest.runner import RunConfig, run


def workload(a) -> list[RequestSpec]:
    rng = np.random.default_rng(a.seed)
    prefixes = [rng.integers(1000, 40000, a.prefix_len).tolist() for _ in range(a.prefixes)]
    out = []
    for i in range(a.requests):
        k = 0 if rng.random() < a.hot_share else i % a.prefixes
        p = prefixes[k] + rng.integers(1000, 40000, a.suffix_len).tolist()
        out.append(RequestSpec(p, None, a.output_len, len(p)))
    return out


def run_policy(policy: str, a, gateway_args: list[str]) -> dict:
    procs, urls = [], []
    try:
        for _ in range(a.workers):
            port = free_port()
            procs.append(spawn([*STUB_WORKER, "--port", str(port), "--itl", str(a.itl),
                                "--prefill-per-token", str(a.prefill_per_token), "--cache-tokens", str(a.cache_tokens)]))
            urls.append(f"http://127.0.0.1:{port}")
        gport = free_port()
        procs.append(spawn(["-m", "gateway", "--workers", ",".join(urls), "--port", str(gport), "--policy", policy,
                            "--log-level", "warning", *gateway_args]))
        for u in urls:
            wait_healthy(u, interval=0.1)
        gw = f"http://127.0.0.1:{gport}"
        wait_healthy(gw, interval=0.1)
        reqs = workload(a)
        cfg = RunConfig(base_url=gw, model="stub", rate=a.rate, num_requests=a.requests, warmup=0, seed=a.seed,
                        label=policy)
        summary = asyncio.run(run(cfg, reqs, progress=False))
        stats = [httpx.get(u + "/_stats", timeout=5).json() for u in urls]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)
    served = [s["served"] for s in stats]
    mean = sum(served) / len(served)
    return {"policy": policy, "completed": summary["completed"], "failed": summary.get("failed", 0),
            "median_ttft_ms": summary["median_ttft_ms"], "p99_ttft_ms": summary["p99_ttft_ms"],
            "mean_ttft_ms": summary["mean_ttft_ms"], "served_per_worker": served,
            "max_mean_load": max(served) / mean if mean else None,
            "cache_hit_rate": sum(s["hit_tokens"] for s in stats) / max(1, sum(s["prompt_tokens"] for s in stats)),
            "achieved_request_rate": summary["achieved_request_rate"]}


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--prefixes", type=int, default=8)
    ap.add_argument("--prefix-len", type=int, default=1024)
    ap.add_argument("--suffix-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=8)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--rate", type=float, default=6.0)
    ap.add_argument("--prefill-per-token", type=float, default=0.0005, help="stub seconds per uncached token")
    ap.add_argument("--cache-tokens", type=int, default=3456, help="stub prefix-cache size (tokens)")
    ap.add_argument("--itl", type=float, default=0.005)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hot-share", type=float, default=0.0, help="share of requests on the first prefix")
    ap.add_argument("--policies", default="jsq,prefix")
    ap.add_argument("--gateway-arg", action="append", default=[], help="extra gateway flag (repeatable)")
    ap.add_argument("--out", default=None)


def main(a: argparse.Namespace) -> int:
    results = {p: run_policy(p, a, a.gateway_arg) for p in a.policies.split(",")}
    cmd = a.command
    doc = {"command": cmd, "settings": vars(a), "results": results}
    if "jsq" in results and "prefix" in results:
        doc["prefix_ttft_p50_ratio_vs_jsq"] = results["prefix"]["median_ttft_ms"] / results["jsq"]["median_ttft_ms"]
        doc["prefix_max_mean_load"] = results["prefix"]["max_mean_load"]
    md = [f"# Prefix-aware routing vs JSQ\n\nCommand: `{cmd}`\n",
          f"{a.workers} stub workers with a {a.cache_tokens}-token LRU prefix cache, one prefill at a time at "
          f"{a.prefill_per_token * 1000:g} ms per uncached token; {a.requests} requests, Poisson {a.rate:g} req/s, "
          f"{a.prefixes} system prompts of {a.prefix_len} tokens + unique {a.suffix_len}-token suffixes, "
          f"{a.output_len} output tokens" + (f"; {a.hot_share:.0%} of requests on one prefix" if a.hot_share else "")
          + ".\n",
          "| policy | completed | TTFT p50 (ms) | TTFT p99 (ms) | cache hit rate | requests per worker | max/mean |",
          "|---|---:|---:|---:|---:|---|---:|"]
    for r in results.values():
        md.append(f"| {r['policy']} | {r['completed']} | {r['median_ttft_ms']:.0f} | {r['p99_ttft_ms']:.0f} | "
                  f"{r['cache_hit_rate']:.2f} | {' / '.join(map(str, r['served_per_worker']))} | "
                  f"{r['max_mean_load']:.2f} |")
    if "prefix_ttft_p50_ratio_vs_jsq" in doc:
        md.append(f"\nTTFT p50 prefix/JSQ: {doc['prefix_ttft_p50_ratio_vs_jsq']:.3f}; "
                  f"max/mean requests per worker (prefix): {doc['prefix_max_mean_load']:.2f}.")
    print("\n".join(md), flush=True)
    if a.out:
        out = Path(a.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=2) + "\n")
        out.with_suffix(".md").write_text("\n".join(md) + "\n")
    return doc
