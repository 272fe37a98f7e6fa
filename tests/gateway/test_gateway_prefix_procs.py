"""Prefix-aware routing with real processes: a gateway in front of stub workers that
model a prefix cache (benchmarks/stub_worker.py), on the shared-prefix workload of
benchmarks/prefix_bench.py (8 system prompts of 1024 tokens, unique 64-token suffixes,
Poisson arrivals), once with JSQ and once with the prefix policy."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import prefix_bench  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_prefix_policy_cuts_ttft_without_a_hot_spot():
    doc = prefix_bench.main(["--requests", "72"])
    jsq, prefix = doc["results"]["jsq"], doc["results"]["prefix"]
    assert jsq["completed"] == prefix["completed"] == 72
    assert prefix["cache_hit_rate"] > jsq["cache_hit_rate"] + 0.3
    assert doc["prefix_ttft_p50_ratio_vs_jsq"] <= 0.7
    assert doc["prefix_max_mean_load"] <= 1.5
