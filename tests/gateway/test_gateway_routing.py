"""Routing policies as pure functions, and metrics parsing."""

import random

from gateway.routing.base import WorkerState, effective_load
from gateway.routing.load import RoundRobin, jsq
from gateway.scraper import parse_metrics


def test_jsq_prefers_least_loaded_and_skips_unhealthy():
    a, b, c = WorkerState("a", in_flight=3), WorkerState("b", in_flight=1), WorkerState("c", in_flight=0, healthy=False)
    assert jsq([a, b, c], now=10.0, stale_after=2.0, rng=random.Random(0)) is b
    assert jsq([c], 10.0, 2.0, random.Random(0)) is None


def test_scraped_load_from_others_counts_but_ours_not_twice():
    w = WorkerState("a", in_flight=2, waiting=1, running=4, scraped_at=9.5, in_flight_at_scrape=2)
    assert effective_load(w, now=10.0, stale_after=2.0) == 2 + (5 - 2)     # 3 requests from elsewhere
    stale = WorkerState("b", in_flight=2, waiting=50, running=50, scraped_at=1.0, in_flight_at_scrape=0)
    assert effective_load(stale, now=10.0, stale_after=2.0) == 2           # stale figures ignored
    busy_elsewhere = WorkerState("c", in_flight=0, waiting=6, running=0, scraped_at=9.9)
    idle = WorkerState("d", in_flight=1, waiting=0, running=1, scraped_at=9.9, in_flight_at_scrape=1)
    assert jsq([busy_elsewhere, idle], 10.0, 2.0, random.Random(0)) is idle


def test_ties_are_random_and_round_robin_cycles():
    ws = [WorkerState(str(i)) for i in range(3)]
    picks = {jsq(ws, 0.0, 2.0, random.Random(seed)).url for seed in range(30)}
    assert picks == {"0", "1", "2"}
    rr = RoundRobin()
    assert [rr(ws, 0.0, 2.0, None).url for _ in range(6)] == ["1", "2", "0", "1", "2", "0"]


def test_parse_metrics_sums_labels_and_accepts_old_kv_name():
    text = """# HELP vllm:num_requests_running x
vllm:num_requests_running{model_name="a",engine="0"} 2.0
vllm:num_requests_running{model_name="a",engine="1"} 1.0
vllm:num_requests_waiting{model_name="a"} 4.0
vllm:gpu_cache_usage_perc{model_name="a"} 0.5
vllm:generation_tokens_total{model_name="a"} 99.0
"""
    assert parse_metrics(text) == {"running": 3.0, "waiting": 4.0, "kv_usage": 0.5}
