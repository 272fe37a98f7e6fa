"""Prefix-aware routing with real processes: a gateway in front of stub workers that
model a prefix cache (benchmarks/lib/stub_worker.py), on the shared-prefix workload of
``swiftserve bench gateway prefix`` (8 system prompts of 1024 tokens, unique 64-token suffixes,
Poisson arrivals), once with JSQ and once with the prefix policy."""

import pytest

from benchmarks import cli

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_prefix_policy_cuts_ttft_without_a_hot_spot():
    doc = cli.run("gateway", "prefix", ["--requests", "72"])
    jsq, prefix = doc["results"]["jsq"], doc["results"]["prefix"]
    assert jsq["completed"] == prefix["completed"] == 72
    assert prefix["cache_hit_rate"] > jsq["cache_hit_rate"] + 0.3
    assert doc["prefix_ttft_p50_ratio_vs_jsq"] <= 0.7
    assert doc["prefix_max_mean_load"] <= 1.5
