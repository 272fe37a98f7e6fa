"""Combine the reliability runs into ``summary.json`` (results/reliability/README.md has the commands).

    python -m benchmarks report reliability results/reliability

Reads ``suite_counts.json`` (written by pytest ``--reliability-out``: the fault scenarios
and the outcome of every request sent during them, the fuzz cases and the 5xx among them)
and ``soak.json`` (``swiftserve-loadtest soak``), and writes ``summary.json``:

* ``faults_tried``: fault scenarios run;
* ``requests_lost``: requests that got neither a complete answer nor an explicit error,
  in the fault scenarios and in the soak together;
* ``malformed_cases``: hostile / malformed requests sent by the fuzz suites;
* ``server_errors``: 5xx answers among them;
* ``soak_seconds``: length of the soak's load phase;
* ``rss_growth_pct``: the largest RSS growth of any process of the stack over the soak;

and the figures of the runs whose files are there: ``failover.json``
(``benchmarks/gateway/failover.py``: ``kill_midstream_completed_pct``,
``hang_midstream_completed_pct``, ``migrated_greedy_identical``), ``rolling_restart.json``
(``benchmarks/gateway/rolling_restart.py``: ``rolling_restart_errors``) and ``hostile.json``
(``benchmarks/serve/hostile.py``: ``hostile_cases``, ``hostile_5xx``, ``hostile_engine_deaths``,
``max_concurrent_latency_ms_under_hostile``, ``dead_engine_recovered_s``,
``slow_header_connections_closed_s``).
Keys already in ``summary.json`` that no input produces are kept.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.lib.records import merge_json


def summarize(directory: Path) -> dict:
    counts = json.loads((directory / "suite_counts.json").read_text())
    soak = json.loads((directory / "soak.json").read_text())["verdict"]
    faults = counts["faults"]
    fuzz = counts["fuzz"].values()
    return {
        "faults_tried": len(faults),
        "requests_lost": sum(f["lost"] for f in faults.values()) + soak["requests_lost"],
        "malformed_cases": sum(f["cases"] for f in fuzz),
        "server_errors": sum(f["server_errors"] for f in fuzz),
        "soak_seconds": round(soak["soak_seconds"], 1),
        "rss_growth_pct": round(soak["rss_growth_pct"], 2),
        **run_figures(directory),
    }


def run_figures(directory: Path) -> dict:
    """The ``figures`` of each benchmark run file present."""
    out = {}
    for name in ("failover.json", "rolling_restart.json", "hostile.json"):
        path = directory / name
        if path.exists():
            out.update(json.loads(path.read_text())["figures"])
    return out


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("directory", nargs="?", default="results/reliability")


def main(args: argparse.Namespace) -> int:
    directory = Path(args.directory)
    summary = merge_json(directory / "summary.json", summarize(directory), indent=2)
    print(json.dumps(summary, indent=2))
    return 0
