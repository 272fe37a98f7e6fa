"""Routing policies: pure functions of (workers, now, rng) -> worker.

Join-shortest-queue (``jsq``). A worker's effective load is what this gateway has in
flight to it now plus the load the worker reported that is *not* ours:

    load = in_flight_now + max(0, (waiting + running)_scraped - in_flight_at_scrape)

Scraped figures lag (they are up to one scrape interval old, and a request we just
sent is not in them yet); our own in-flight count is exact and immediate, which is
what spreads a burst evenly. Subtracting the in-flight count observed at scrape time
avoids counting our own requests twice while still seeing load from other gateways
or clients. Figures older than ``stale_after`` are unknown: load = in_flight_now.

``prefix`` (gateway.prefix_routing): expected cached prompt prefix vs this load, with
a bounded-load rule; the default, for prompt-heavy traffic. Other policies: ``p2c`` (power of two choices on the same load), ``round_robin``,
``kv`` (JSQ on load plus KV-cache occupancy, so that among equally loaded workers the
one with the emptiest cache wins and a nearly full cache (> 95%) is avoided while any
other worker has room). Only routable workers are considered (healthy, circuit not
open, not draining); ties are broken at random.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass
class WorkerState:
    url: str
    healthy: bool = True                 # active health checks (thresholded)
    draining: bool = False               # removed by discovery: no new requests
    in_flight: int = 0
    waiting: float | None = None         # last scraped vllm:num_requests_waiting
    running: float | None = None         # last scraped vllm:num_requests_running
    kv_usage: float | None = None        # last scraped vllm:kv_cache_usage_perc (0..1)
    scraped_at: float | None = None      # monotonic time of the last successful scrape
    in_flight_at_scrape: int = 0
    prefix_queries: float | None = None  # last scraped vllm:prefix_cache_queries_total (tokens)
    prefix_hits: float | None = None     # last scraped vllm:prefix_cache_hits_total (tokens)
    cache_tokens: int | None = None      # KV-cache size from vllm:cache_config_info (blocks x block size)
    # circuit breaker (passive): consecutive request failures, open until, half-open trial
    failures: int = 0
    open_until: float = 0.0
    trial_in_flight: bool = False

    def routable(self, now: float) -> bool:
        if not self.healthy or self.draining:
            return False
        if self.open_until > now:
            return False
        if self.open_until and self.trial_in_flight:       # half-open: one trial at a time
            return False
        return True


def effective_load(w: WorkerState, now: float, stale_after: float) -> float:
    if w.scraped_at is None or now - w.scraped_at > stale_after or w.waiting is None or w.running is None:
        return float(w.in_flight)
    others = max(0.0, (w.waiting + w.running) - w.in_flight_at_scrape)
    return w.in_flight + others


def _pick_min(cands: list[WorkerState], key, rng: random.Random) -> WorkerState | None:
    if not cands:
        return None
    vals = [key(w) for w in cands]
    best = min(vals)
    return rng.choice([w for w, v in zip(cands, vals) if v == best])


def jsq(workers, now, stale_after, rng, req=None):
    return _pick_min([w for w in workers if w.routable(now)], lambda w: effective_load(w, now, stale_after), rng)


def p2c(workers, now, stale_after, rng, req=None):
    live = [w for w in workers if w.routable(now)]
    if len(live) <= 2:
        return jsq(live, now, stale_after, rng)
    return jsq(rng.sample(live, 2), now, stale_after, rng)


def kv_aware(workers, now, stale_after, rng, req=None):
    live = [w for w in workers if w.routable(now)]
    fresh = lambda w: w.scraped_at is not None and now - w.scraped_at <= stale_after  # noqa: E731
    roomy = [w for w in live if not (fresh(w) and (w.kv_usage or 0.0) > 0.95)]
    cands = roomy or live

    def key(w):
        kv = w.kv_usage if (fresh(w) and w.kv_usage is not None) else 0.0
        return (effective_load(w, now, stale_after), kv)

    return _pick_min(cands, key, rng)


class RoundRobin:
    def __init__(self) -> None:
        self.i = 0

    def __call__(self, workers, now, stale_after, rng, req=None):
        live = [w for w in workers if w.routable(now)]
        if not live:
            return None
        self.i += 1
        return live[self.i % len(live)]


POLICIES = ("prefix", "jsq", "p2c", "round_robin", "kv")


def make_policy(name: str, prefix_index=None, **prefix_options):
    """A policy callable ``(workers, now, stale_after, rng, req=None) -> worker | None``."""
    table = {"jsq": jsq, "p2c": p2c, "kv": kv_aware}
    if name in table:
        return table[name]
    if name == "round_robin":
        return RoundRobin()
    if name == "prefix":
        from gateway.prefix import PrefixIndex
        from gateway.prefix_routing import PrefixAware

        return PrefixAware(prefix_index if prefix_index is not None else PrefixIndex(), **prefix_options)
    raise ValueError(f"unknown routing policy {name!r} ({', '.join(POLICIES)})")
