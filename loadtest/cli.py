"""``swiftserve-loadtest`` / ``python -m loadtest``: run, sweep, compare.

  run      one arrival rate -> one result JSON
  sweep    several rates for one label (stops early once p99 TTFT exceeds --stop-ttft-ms)
  compare  result files/directories -> table.md, PNG plots, report.html
  soak     start a stack, Poisson load at a fraction of its capacity for a long time,
           fail on RSS / descriptor growth or any lost request (loadtest.soak)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import shlex
import sys
from pathlib import Path


def _add_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="gateway or worker URL")
    p.add_argument("--model", default=None, help="model name (default: first of /v1/models)")
    p.add_argument("--endpoint", choices=["completions", "chat"], default="completions")
    p.add_argument("--dataset", choices=["random", "shared-prefix", "jsonl"], default="random")
    p.add_argument("--dataset-path", default=None, help="JSONL file for --dataset jsonl")
    p.add_argument("--input-len", type=int, default=1000, help="prompt tokens (random; prompt-heavy default)")
    p.add_argument("--output-len", type=int, default=100, help="output tokens")
    p.add_argument("--range-ratio", type=float, default=0.0, help="+/- variation of random lengths")
    p.add_argument("--prefix-len", type=int, default=800, help="shared-prefix: shared tokens")
    p.add_argument("--num-prefixes", type=int, default=4)
    p.add_argument("--num-requests", type=int, default=100)
    p.add_argument("--arrival", choices=["poisson", "gamma", "constant"], default="poisson")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape (1 = Poisson, <1 burstier)")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--warmup", type=int, default=2, help="unmeasured sequential requests first")
    p.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                   help="let the model stop early (default: ignore EOS for fixed output lengths)")
    p.add_argument("--slo-ttft-ms", type=float, default=None)
    p.add_argument("--slo-tpot-ms", type=float, default=None)
    p.add_argument("--slo-e2el-ms", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--label", default="run")
    p.add_argument("--api-key", default=None)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--result-dir", default="results/loadtest", help="where result JSON files go")


def _requests(a):
    from loadtest import datasets

    if a.dataset == "random":
        return datasets.random_prompts(a.num_requests, a.input_len, a.output_len, range_ratio=a.range_ratio, seed=a.seed)
    if a.dataset == "shared-prefix":
        return datasets.shared_prefix_prompts(a.num_requests, a.prefix_len, max(1, a.input_len - a.prefix_len),
                                              a.output_len, a.num_prefixes, a.seed)
    if not a.dataset_path:
        raise SystemExit("--dataset jsonl needs --dataset-path")
    return datasets.jsonl_prompts(a.dataset_path, a.num_requests, a.output_len)


def _run_one(a, rate: float) -> dict:
    from loadtest.runner import RunConfig, run

    slos = {k: v for k, v in (("ttft", a.slo_ttft_ms), ("tpot", a.slo_tpot_ms), ("e2el", a.slo_e2el_ms)) if v}
    cfg = RunConfig(base_url=a.base_url, model=a.model, endpoint=a.endpoint, rate=rate, arrival=a.arrival,
                    burstiness=a.burstiness, num_requests=a.num_requests, max_concurrency=a.max_concurrency,
                    warmup=a.warmup, ignore_eos=a.ignore_eos, seed=a.seed, timeout=a.timeout, label=a.label,
                    slos_ms=slos, api_key=a.api_key)
    res = asyncio.run(run(cfg, _requests(a)))
    res["command"] = "swiftserve-loadtest " + " ".join(shlex.quote(x) for x in sys.argv[1:])
    out = Path(a.result_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = f"{a.label}-rate{rate if math.isfinite(rate) else 'inf'}.json"
    (out / name).write_text(json.dumps(res, indent=1))
    print(f"{a.label} rate={rate}: ok={res['completed']} failed={res['failed']} "
          f"achieved={res['achieved_request_rate'] or 0:.2f}/s TTFT p50={res['median_ttft_ms']:.0f}ms "
          f"p99={res['p99_ttft_ms']:.0f}ms TPOT p50={res['median_tpot_ms']:.1f}ms "
          f"out={res['output_throughput']:.1f} tok/s send-lag p99={res['p99_send_lag_ms']:.1f}ms -> {out / name}")
    for w in res["warnings"]:
        print("warning:", w, file=sys.stderr)
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="swiftserve-loadtest", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="one open-loop run at one request rate")
    _add_run_args(r)
    r.add_argument("--rate", type=float, default=1.0, help="requests/s (inf: all at once)")
    s = sub.add_parser("sweep", help="runs at several rates for one label")
    _add_run_args(s)
    s.add_argument("--rates", type=float, nargs="+", required=True)
    s.add_argument("--stop-ttft-ms", type=float, default=None,
                   help="stop the sweep after a rate whose p99 TTFT exceeds this")
    c = sub.add_parser("compare", help="table + plots + HTML from result files")
    c.add_argument("paths", nargs="+", help="result JSON files or directories")
    c.add_argument("--out", default="results/loadtest/report")
    k = sub.add_parser("soak", help="long run against a fresh stack: leaks and lost requests fail it")
    from loadtest.soak import add_arguments, main_from_args

    add_arguments(k)
    a = p.parse_args(argv)
    if a.cmd == "soak":
        return main_from_args(a)
    if a.cmd == "run":
        res = _run_one(a, a.rate)
        return 0 if res["completed"] else 1
    if a.cmd == "sweep":
        for rate in a.rates:
            res = _run_one(a, rate)
            if a.stop_ttft_ms and res["p99_ttft_ms"] > a.stop_ttft_ms:
                print(f"p99 TTFT {res['p99_ttft_ms']:.0f} ms > {a.stop_ttft_ms} ms: stopping the sweep")
                break
        return 0
    from loadtest.report import load_results, table, write_report

    results = load_results([Path(x) for x in a.paths])
    print(table(results))
    page = write_report(results, Path(a.out), "swiftserve-loadtest " + " ".join(shlex.quote(x) for x in sys.argv[1:]))
    print(f"report: {page}")
    return 0
