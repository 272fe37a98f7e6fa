"""loadtest.soak.judge on synthetic samples: which descriptor growth counts as a leak."""

import argparse

from loadtest.client import RequestRecord
from loadtest.soak import add_arguments, judge


def _args():
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args([])


def _done():
    r = RequestRecord(0.0)
    r.success = r.done = True
    return r


def _run(other_fds, sockets, peak):
    samples = [{"t": float(i), "done": i, "rss_mb": {"gateway": 100.0}, "kv_blocks_used": {}, "in_flight": {},
                "fds": {"gateway": other_fds(i) + sockets(i)}, "sockets": {"gateway": sockets(i)}}
               for i in range(40)]
    idle = {"kv_blocks_used": {"worker1": 0}, "in_flight": {"worker1": 0}}
    return {"records": [_done() for _ in range(40)], "samples": samples, "idle": idle, "capacity_rps": 2.0,
            "rate_rps": 1.6, "load_seconds": 40.0, "peak_concurrency": peak}


def test_a_late_burst_of_pooled_connections_is_not_a_leak():
    # 30 sockets appear in the last samples (a burst of 15 concurrent requests, each kept alive in and out).
    v = judge(_args(), _run(lambda i: 12, lambda i: 10 + (30 if i > 34 else 0), peak=15), {"gateway": None})
    assert v["socket_growth"] == 30 and v["socket_growth_limit"] == 20 + 2 * 15
    assert v["passed"], v["checks"]


def test_sockets_growing_with_requests_beyond_the_peak_fail():
    v = judge(_args(), _run(lambda i: 12, lambda i: 10 + 3 * i, peak=4), {"gateway": None})
    assert not v["checks"]["socket_growth_within_limit"] and not v["passed"]
    assert v["checks"]["fd_growth_within_limit"]


def test_non_socket_descriptors_growing_fail_whatever_the_concurrency():
    v = judge(_args(), _run(lambda i: 12 + i, lambda i: 10, peak=50), {"gateway": None})
    assert v["fd_growth"] > 20 and not v["checks"]["fd_growth_within_limit"] and not v["passed"]
    assert v["checks"]["socket_growth_within_limit"]
