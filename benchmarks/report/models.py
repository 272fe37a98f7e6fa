"""results/models/summary.json from the runs that measured each figure.

    python -m benchmarks report models --junit results/models/tests.xml \
        --sliding results/models/sliding_window_kv.json \
        --zack results/models/zack_gemma3_sweep.json results/models/zack_gemma3_sweep_fine.json \
        --out results/models/summary.json

- ``parity_families``: families whose test of ``tests/refengine/test_families_parity.py`` passed
  in the JUnit report (every case of the family: both attention paths, windowed and not);
- ``swiftkv_families.reference``: the same for ``tests/refengine/test_swiftkv_families.py``;
  ``swiftkv_families.vllm``: the families whose SwiftKV checkpoints vLLM with the plugin served
  with the reference engine's greedy tokens, read from ``--vllm-ready``
  (``results/vllm/gpu_ready.json`` of swiftserve_vllm/gpu_ready.py);
- ``gemma3_270m_served``: ``tests/swiftserve/test_stack_gemma3.py`` passed (not skipped);
- ``sliding_window_kv_bytes_ratio_4k``: ``ratio_freed_over_kept`` of benchmarks/engine/sliding_window_kv.py;
- ``zack_gemma3_rate_at_99pct_ppl`` / ``..._task``: the highest swept ZACK rate of the
  ``modelkit eval`` sweeps whose perplexity ratio (baseline / model) is >= 0.99, resp. whose task
  accuracy relative to the baseline's is >= 0.99 (point estimates; 0.0 when no swept rate keeps it).
"""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET
from pathlib import Path

from benchmarks.lib.records import write_json


def passed_families(junit: Path, module: str) -> list[str]:
    """Families (the test id's first ``-``-separated part) all of whose cases in ``module`` passed."""
    ok: dict[str, bool] = {}
    for case in ET.parse(junit).iter("testcase"):
        if not case.get("classname", "").endswith(module):
            continue
        name = case.get("name", "")
        if "[" not in name:
            continue
        ids = name[name.index("[") + 1:-1].split("-")
        family = next(i for i in ids if i not in ("cpp", "torch"))
        good = not any(child.tag in ("failure", "error", "skipped") for child in case)
        ok[family] = ok.get(family, True) and good
    return sorted(f for f, good in ok.items() if good)


def test_passed(junit: Path, module: str, name: str) -> bool:
    for case in ET.parse(junit).iter("testcase"):
        if case.get("classname", "").endswith(module) and case.get("name") == name:
            return not any(child.tag in ("failure", "error", "skipped") for child in case)
    return False


def rate_at(results: dict, key: str, floor: float = 0.99) -> float:
    best = 0.0
    for label, r in results.items():
        rate = r["overrides"]["kv_methods"]["zack"]["rate"]
        q = (r["ppl_baseline"] / r["ppl"]) if key == "ppl" else r.get("task_accuracy_relative")
        if q is not None and q >= floor:
            best = max(best, rate)
    return best


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--junit", required=True)
    ap.add_argument("--sliding", required=True)
    ap.add_argument("--zack", required=True, nargs="+", help="modelkit eval sweep JSON files (merged)")
    ap.add_argument("--vllm-ready", default="results/vllm/gpu_ready.json",
                    help="swiftserve_vllm/gpu_ready.py's output: its swiftkv_families")
    ap.add_argument("--out", default="results/models/summary.json")


def main(args: argparse.Namespace) -> int:
    junit = Path(args.junit)
    zack = {k: v for f in args.zack for k, v in json.loads(Path(f).read_text())["results"].items()}
    doc = {
        "parity_families": passed_families(junit, "test_families_parity"),
        "gemma3_270m_served": test_passed(junit, "test_stack_gemma3", "test_swiftserve_up_serves_gemma3_270m"),
        "sliding_window_kv_bytes_ratio_4k": round(json.loads(Path(args.sliding).read_text())["ratio_freed_over_kept"], 4),
        "swiftkv_families": {"reference": passed_families(junit, "test_swiftkv_families"),
                             "vllm": json.loads(Path(args.vllm_ready).read_text())["swiftkv_families"]},
        "zack_gemma3_rate_at_99pct_ppl": rate_at(zack, "ppl"),
        "zack_gemma3_rate_at_99pct_task": rate_at(zack, "task"),
    }
    write_json(args.out, doc)
    print(json.dumps(doc, indent=1))
    return 0
