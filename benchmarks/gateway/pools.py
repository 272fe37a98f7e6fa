"""Several models behind one gateway, with real SmolLM2 workers: the figures of results/gateway/summary.json.

    python -m benchmarks gateway pools pools    --out results/gateway/pools.json
    python -m benchmarks gateway pools split    --out results/gateway/split.json
    python -m benchmarks gateway pools shadow   --out results/gateway/shadow.json
    python -m benchmarks gateway pools overhead --out results/gateway/overhead.json

Each command starts its own workers (``python -m worker``, one per model, ``--dtype`` float32 by
default, one torch thread each) and a gateway (``python -m gateway``, JSQ), runs, stops them,
writes ``--out`` (the command line, the settings, every count) and merges its key into
``--summary`` (default results/gateway/summary.json):

* ``pools``: a mixed pool (the original and its 13% SwiftKV variant); ``--requests`` requests,
  each naming one of the two served models in turn, 8 at a time, streamed and not. A request
  is *wrong* when it fails or its answer names another model (workers answer with their own
  name), and each worker's ``vllm:request_success_total`` must grow by exactly the requests
  for its model. Key ``mixed_pool_wrong_model_pct``.
* ``split``: an alias over the two (``--weights``, default 90/10), ``--requests`` requests
  (default 2,000; ``max_tokens`` 1, 8 at a time), half with a distinct ``user`` (sticky
  split key), half without (random); the variant is read from each answer's ``model``. Key
  ``split_ratio_error_pct``: the largest |observed share - configured share| over the
  variants, in percentage points.
* ``shadow``: the original, the 13% and the 50% variants; one alias per variant, each
  answered by that variant only and scored by the original on every request (the original's
  own alias is the control). ``--prompts`` greedy chat questions per alias (``max_tokens``
  48, streamed and not); the mean gap and agreement per variant are read from the gateway's
  ``/metrics``. Key ``shadow_gap_nats_per_token`` (variant -> mean gap, nats per token).
* ``overhead``: the original and the 13% variant behind an alias (``--weights``, default
  90/10: a canary), Poisson arrivals at ``--rate`` of streamed completions (random-token
  prompts of ``--input-len``, ``--output-len`` tokens, loadtest's runner), in rounds that
  alternate shadowing off and on (off, on, on, off, ...; every canary answer sampled, the gateway's
  default bounds and ``--shadow-yield``, ``all`` by default as ``swiftserve up`` sets it for pools
  sharing a machine) by rewriting the gateway's models file (it re-reads it; same processes
  throughout). Every round has prompts of its own (one that repeated another's would be
  answered from the prefix cache) and each pair the same arrival times. Key
  ``shadow_overhead_client_ttft_ratio``: median client TTFT with shadowing on / off.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from benchmarks.lib.records import ROOT, UsageError, merge_json, write_json
from benchmarks.lib.procs import free_port, metric_sum as metric, stop_groups, wait_healthy

ORIG, V13, V50 = "SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct-SwiftKV-13pct", "SmolLM2-135M-Instruct-SwiftKV"
TOPICS = ["the sea", "volcanoes", "the moon", "bees", "trains", "coffee", "winter", "libraries", "rivers", "bread",
          "clocks", "the desert", "music", "forests", "bicycles", "rain", "chess", "bridges", "gardens", "stars",
          "paper", "islands", "cats", "markets", "snow"]
TEMPLATES = ["Write two sentences about {}.", "What are three facts about {}?"]


class Stack:
    """One worker per model and a gateway, stopped on exit."""

    def __init__(self, models: list[str], gateway_args: list[str], dtype: str, logs: Path,
                 gateway_tree: str | None = None) -> None:
        self.procs: list[subprocess.Popen] = []
        self.workers: dict[str, str] = {}
        self.models, self.gateway_args, self.dtype, self.logs = models, gateway_args, dtype, logs
        self.gateway_tree = gateway_tree       # another gateway/ (and swiftcommon/) to run, side by side

    def __enter__(self) -> "Stack":
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        try:
            for model in self.models:
                port = free_port()
                log = open(self.logs / f"worker-{model}.log", "w")
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-m", "worker", "--model", model, "--port", str(port), "--dtype", self.dtype,
                     "--torch-threads", "1", "--max-model-len", "2048", "--kv-cache-memory-gb", "0.25",
                     "--log-level", "warning"], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                    start_new_session=True))
                self.workers[model] = f"http://127.0.0.1:{port}"
            for proc, url in zip(self.procs, self.workers.values()):
                wait_healthy(url, proc, 900)
            port = free_port()
            log = open(self.logs / "gateway.log", "w")
            genv = {**env, "PYTHONPATH": f"{self.gateway_tree}:{ROOT}"} if self.gateway_tree else env
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "gateway", "--workers", ",".join(self.workers.values()), "--port", str(port),
                 "--policy", "jsq", "--log-level", "warning", *self.gateway_args], stdout=log,
                stderr=subprocess.STDOUT, env=genv, cwd=self.gateway_tree or ROOT, start_new_session=True))
            self.url = f"http://127.0.0.1:{port}"
            wait_healthy(self.url, self.procs[-1], 60)
            deadline = time.time() + 30        # every model discovered
            while len(httpx.get(self.url + "/v1/models").json()["data"]) < len(self.models) and time.time() < deadline:
                time.sleep(0.2)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        stop_groups(list(reversed(self.procs)))


def answer_models(r: httpx.Response) -> set[str]:
    return set(re.findall(r'"model":\s*"([^"]+)"', r.text))


def merge_summary(path: str, key: str, value) -> None:
    merge_json(path, {key: value})
    print(f"{path}: {key} = {json.dumps(value)}")


def _post_all(url: str, bodies: list[dict], concurrency: int) -> list[httpx.Response]:
    with httpx.Client(timeout=300, limits=httpx.Limits(max_connections=concurrency)) as client:
        with ThreadPoolExecutor(concurrency) as pool:
            return list(pool.map(lambda b: client.post(url, json=b), bodies))


# ---- the four figures ---------------------------------------------------------------------------
def _mixed_pool(a, logs: Path, tree: str | None) -> dict:
    with Stack([ORIG, V13], [], a.dtype, logs, tree) as st:
        before = {m: metric(httpx.get(u + "/metrics").text, "vllm:request_success_total") for m, u in st.workers.items()}
        names = [(ORIG, V13)[i % 2] for i in range(a.requests)]
        bodies = [{"model": m, "prompt": f"Request {i}: the capital of France is", "max_tokens": 4, "temperature": 0,
                   "stream": i % 4 == 1} for i, m in enumerate(names)]
        t0 = time.time()
        rs = _post_all(st.url + "/v1/completions", bodies, 8)
        seconds = time.time() - t0
        wrong = sum(1 for m, r in zip(names, rs) if r.status_code != 200 or answer_models(r) != {m})
        after = {m: metric(httpx.get(u + "/metrics").text, "vllm:request_success_total") for m, u in st.workers.items()}
    served = {m: after[m] - before[m] for m in after}
    sent = dict(Counter(names))
    return {"requests": a.requests, "seconds": round(seconds, 1), "wrong": wrong,
            "wrong_pct": round(100.0 * wrong / a.requests, 3), "statuses": dict(Counter(r.status_code for r in rs)),
            "sent_per_model": sent, "served_per_worker": served, "workers_served_exactly_their_model": served == sent}


def run_pools(a, logs: Path) -> dict:
    out = _mixed_pool(a, logs, None)
    if a.compare_ref:                           # the gateway before model-aware pools, on the same workload
        with tempfile.TemporaryDirectory(prefix="gateway-before-") as tree:
            subprocess.run(f"git archive {a.compare_ref} gateway swiftcommon | tar -x -C {tree}", shell=True,
                           check=True, cwd=ROOT)
            out["before"] = {"ref": a.compare_ref, **_mixed_pool(a, logs, tree)}
    out["key"] = ("mixed_pool_wrong_model_pct", out["wrong_pct"])
    return out


def run_split(a, logs: Path) -> dict:
    weights = {ORIG: a.weights[0], V13: a.weights[1]}
    alias = f"--alias=smol={ORIG}:{weights[ORIG]:g},{V13}:{weights[V13]:g}"
    with Stack([ORIG, V13], [alias], a.dtype, logs) as st:
        bodies = [{"model": "smol", "prompt": f"Request {i}: hello", "max_tokens": 1, "temperature": 0,
                   **({"user": f"user-{i}"} if i % 2 == 0 else {})} for i in range(a.requests)]
        t0 = time.time()
        rs = _post_all(st.url + "/v1/completions", bodies, 8)
        seconds = time.time() - t0
        failed = sum(r.status_code != 200 for r in rs)
        seen = Counter(r.json()["model"] for r in rs if r.status_code == 200)
        gw = httpx.get(st.url + "/metrics").text
    total, wsum = sum(seen.values()), sum(weights.values())
    shares = {m: seen[m] / total for m in weights}
    errors = {m: 100.0 * abs(shares[m] - weights[m] / wsum) for m in weights}
    keyed = Counter(r.json()["model"] for r, b in zip(rs, bodies) if r.status_code == 200 and "user" in b)
    return {"requests": a.requests, "seconds": round(seconds, 1), "failed": failed, "configured": weights,
            "observed": dict(seen), "observed_share": shares, "observed_keyed": dict(keyed),
            "error_pct_points": errors,
            "gateway_split_counter": {m: metric(gw, "swiftserve_gateway_split_requests_total", model=m) for m in weights},
            "key": ("split_ratio_error_pct", round(max(errors.values()), 3))}


def _questions(n: int) -> list[str]:
    qs = [t.format(topic) for topic in TOPICS for t in TEMPLATES]
    return [qs[i % len(qs)] for i in range(n)]


def run_shadow(a, logs: Path) -> dict:
    cfg = logs / "models.yaml"
    cfg.write_text("aliases:\n"
                   f"  control: {{targets: {{{ORIG}: 1}}, shadow: {{reference: {ORIG}, fraction: 1.0, "
                   f"models: [{ORIG}]}}}}\n"
                   f"  v13: {{targets: {{{V13}: 1}}, shadow: {{reference: {ORIG}, fraction: 1.0}}}}\n"
                   f"  v50: {{targets: {{{V50}: 1}}, shadow: {{reference: {ORIG}, fraction: 1.0}}}}\n")
    gw_args = ["--models-config", str(cfg), "--shadow-max-rps", "100", "--shadow-max-concurrency", "4",
               "--shadow-max-load", "100", "--shadow-max-tokens", "64"]
    qs = _questions(a.prompts)
    with Stack([ORIG, V13, V50], gw_args, a.dtype, logs) as st:
        t0 = time.time()
        with httpx.Client(timeout=300) as client:
            for alias in ("control", "v13", "v50"):
                for i, q in enumerate(qs):
                    body = {"model": alias, "messages": [{"role": "user", "content": q}], "max_tokens": 48,
                            "temperature": 0, "stream": i % 2 == 1}
                    r = client.post(st.url + "/v1/chat/completions", json=body)
                    assert r.status_code == 200, r.text
            deadline = time.time() + 900
            while True:
                text = client.get(st.url + "/metrics").text
                done = [metric(text, "swiftserve_gateway_shadow_requests_total", model=m) for m in (ORIG, V13, V50)]
                if min(done) >= len(qs) or time.time() > deadline:
                    break
                time.sleep(2)
        seconds = time.time() - t0
    out = {"prompts_per_variant": len(qs), "seconds": round(seconds, 1), "max_tokens": 48, "per_model": {}}
    for m in (ORIG, V13, V50):
        n = metric(text, "swiftserve_gateway_shadow_logprob_gap_nats_per_token_count", model=m)
        out["per_model"][m] = {
            "outcomes": {o: metric(text, "swiftserve_gateway_shadow_requests_total", model=m, outcome=o)
                         for o in ("scored", "scored_no_reference", "failed", "no_answer", "shed_load", "shed_rate",
                                   "shed_concurrency", "no_reference")},
            "gap_nats_per_token": metric(text, "swiftserve_gateway_shadow_logprob_gap_nats_per_token_sum", model=m) / n
            if n else None,
            "variant_nll": _mean(text, "swiftserve_gateway_shadow_nll_nats_per_token", model=m, answer="variant"),
            "reference_nll": _mean(text, "swiftserve_gateway_shadow_nll_nats_per_token", model=m, answer="reference"),
            "greedy_agreement": _mean(text, "swiftserve_gateway_shadow_greedy_agreement", model=m)}
    gaps = {m: round(v["gap_nats_per_token"], 4) for m, v in out["per_model"].items()}
    out["key"] = ("shadow_gap_nats_per_token", {V13: gaps[V13], V50: gaps[V50]})
    out["control_gap_nats_per_token"] = gaps[ORIG]
    return out


def _mean(text: str, name: str, **labels) -> float | None:
    n = metric(text, name + "_count", **labels)
    return round(metric(text, name + "_sum", **labels) / n, 4) if n else None


def run_overhead(a, logs: Path) -> dict:
    from loadtest.datasets import random_prompts
    from loadtest.runner import RunConfig, run

    cfg = logs / "models.yaml"

    def table(fraction: float) -> None:
        text = (f"aliases:\n  smol:\n    targets: {{{ORIG}: {a.weights[0]:g}, {V13}: {a.weights[1]:g}}}\n" +
                (f"    shadow: {{reference: {ORIG}, fraction: {fraction}}}\n" if fraction else ""))
        cfg.write_text(text)

    table(0.0)
    rounds = []
    with Stack([ORIG, V13], ["--models-config", str(cfg), "--shadow-yield", a.shadow_yield], a.dtype, logs) as st:
        for i in range(2 * a.rounds):
            on = i % 4 in (1, 2)                                  # off, on, on, off, ...: drift cancels
            table(1.0 if on else 0.0)
            time.sleep(3)                                         # the gateway re-reads the file (2 s)
            while metric(httpx.get(st.url + "/metrics").text, "swiftserve_gateway_shadow_in_flight") > 0:
                time.sleep(0.5)                                   # the last round's comparisons are over
            before = httpx.get(st.url + "/metrics").text
            # each (off, on) pair of rounds: the same arrival times, but prompts of their own: a round
            # that repeated the last one's prompts would find them in the prefix cache
            reqs = random_prompts(a.requests, a.input_len, a.output_len, seed=100 + i)
            res = asyncio.run(run(RunConfig(st.url, model="smol", rate=a.rate, num_requests=a.requests, seed=i // 2,
                                            label=f"shadow {'on' if on else 'off'}", warmup=1), reqs,
                                  progress=False))
            after = httpx.get(st.url + "/metrics").text
            outcomes = {o: metric(after, "swiftserve_gateway_shadow_requests_total", outcome=o)
                        - metric(before, "swiftserve_gateway_shadow_requests_total", outcome=o)
                        for o in ("scored", "scored_no_reference", "failed", "shed_load", "shed_rate",
                                  "shed_concurrency", "shed_busy", "preempted")}
            ttfts = [r["ttft_s"] for r in res["requests"] if r["ttft_s"] is not None]
            rounds.append({"shadow": on, "median_ttft_ms": res["median_ttft_ms"], "p99_ttft_ms": res["p99_ttft_ms"],
                           "median_tpot_ms": res["median_tpot_ms"], "completed": res["completed"],
                           "achieved_rate": res["achieved_request_rate"], "shadow_outcomes": outcomes,
                           "ttfts_s": ttfts})
            print(f"round {i}: shadow {'on ' if on else 'off'} TTFT p50 {res['median_ttft_ms']:.0f} ms "
                  f"p99 {res['p99_ttft_ms']:.0f} ms, shadow outcomes {outcomes}", flush=True)
    import statistics

    med = {on: statistics.median([t for r in rounds if r["shadow"] == on for t in r["ttfts_s"]]) for on in (False, True)}
    for r in rounds:
        r.pop("ttfts_s")
    # why comparisons failed, from the gateway's log (its warnings), before the log's directory goes
    failures = [line.strip()[:300] for line in (logs / "gateway.log").read_text(errors="replace").splitlines()
                if "shadow comparison" in line][:20]
    return {"rounds": rounds, "median_ttft_ms_off": round(1e3 * med[False], 1),
            "median_ttft_ms_on": round(1e3 * med[True], 1), "rate": a.rate, "input_len": a.input_len,
            "output_len": a.output_len, "weights": a.weights, "shadow_yield": a.shadow_yield,
            "comparison_failures": failures,
            "key": ("shadow_overhead_client_ttft_ratio", round(med[True] / med[False], 3))}


RUNS = {"pools": run_pools, "split": run_split, "shadow": run_shadow, "overhead": run_overhead}


def add_cli_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("figure", choices=RUNS)
    p.add_argument("--out", required=True)
    p.add_argument("--summary", default=str(ROOT / "results/gateway/summary.json"))
    p.add_argument("--dtype", default="float32",
                   help="workers' --dtype (default: %(default)s; 'auto' serves bfloat16 on CPUs with native bf16)")
    p.add_argument("--requests", type=int, default=None,
                   help="pools: 400, split: 2000, overhead: per round, 80 (defaults)")
    p.add_argument("--weights", type=float, nargs=2, default=[90.0, 10.0], metavar=("ORIGINAL", "VARIANT"))
    p.add_argument("--prompts", type=int, default=40, help="shadow: questions per variant (default: %(default)s)")
    p.add_argument("--rate", type=float, default=0.5, help="overhead: requests/s (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=2, help="overhead: rounds with shadowing on, and as many off")
    p.add_argument("--compare-ref", default=None, metavar="GIT_REF",
                   help="pools: also run the gateway of this commit (e.g. the one before model-aware pools)")
    p.add_argument("--shadow-yield", choices=("reference", "all"), default="all",
                   help="overhead: the gateway's --shadow-yield (default: %(default)s, as `swiftserve up` runs "
                        "pools that share one machine, like this bench's)")
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=32)


def main(a: argparse.Namespace) -> int:
    a.requests = a.requests or {"pools": 400, "split": 2000, "shadow": 0, "overhead": 80}[a.figure]
    if a.figure == "split" and a.requests < 2000:
        raise UsageError("split: --requests must be >= 2000 for the summary figure")
    random.seed(0)
    with tempfile.TemporaryDirectory(prefix="pools-bench-") as tmp:
        doc = RUNS[a.figure](a, Path(tmp))
    key, value = doc.pop("key")
    doc = {"command": a.command, "figure": a.figure, key: value, **doc}
    write_json(a.out, doc)
    merge_summary(a.summary, key, value)
    return 0
