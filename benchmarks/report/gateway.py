"""Combine the gateway runs into ``summary.json`` (results/gateway/run.sh has the commands).

    python -m benchmarks report gateway results/gateway

Reads ``bench.json`` (benchmarks/gateway/routing.py) and ``prefix.json``
(benchmarks/gateway/prefix.py) and merges into ``summary.json`` (other keys kept):

* ``overhead_p50_ms``, ``overhead_p99_ms``: latency the gateway adds (through the gateway
  minus direct) under the benchmark's closed-loop load of 16 streaming clients;
* ``prefix_aware_ttft_p50_ratio_vs_jsq``: TTFT p50 with the prefix policy / with JSQ on
  the shared-prefix workload;
* ``prefix_aware_max_load_imbalance``: max / mean requests per worker with the prefix policy.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.lib.records import merge_json


def summarize(directory: Path) -> dict:
    bench = json.loads((directory / "bench.json").read_text())["overhead"]
    prefix = json.loads((directory / "prefix.json").read_text())
    return {
        "overhead_p50_ms": round(bench["added_p50_ms"], 2),
        "overhead_p99_ms": round(bench["added_p99_ms"], 2),
        "prefix_aware_ttft_p50_ratio_vs_jsq": round(prefix["prefix_ttft_p50_ratio_vs_jsq"], 3),
        "prefix_aware_max_load_imbalance": round(prefix["prefix_max_mean_load"], 3),
    }


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("directory", nargs="?", default="results/gateway")


def main(args: argparse.Namespace) -> int:
    directory = Path(args.directory)
    # merged: the model-pool keys come from benchmarks/gateway/pools.py
    summary = merge_json(directory / "summary.json", summarize(directory), indent=2)
    print(json.dumps(summary, indent=2))
    return 0
