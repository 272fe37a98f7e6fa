"""Routing policies: pure functions of (workers, stats, request) -> worker.

Join-shortest-queue. A worker's effective load is what this gateway has in flight to
it now plus the load the worker reported that is *not* ours:

    load = in_flight_now + max(0, (waiting + running)_scraped - in_flight_at_scrape)

Scraped figures lag (they are up to one scrape interval old, and a request we just
sent is not in them yet); our own in-flight count is exact and immediate, which is
what spreads a burst evenly. Subtracting the in-flight count observed at scrape time
avoids counting our own requests twice while still seeing load from other gateways
or clients. Figures older than ``stale_after`` are ignored (load = in_flight_now).
Unhealthy workers are skipped; ties are broken at random.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass
class WorkerState:
    url: str
    healthy: bool = True
    in_flight: int = 0
    waiting: float | None = None          # last scraped vllm:num_requests_waiting
    running: float | None = None          # last scraped vllm:num_requests_running
    kv_usage: float | None = None         # last scraped vllm:kv_cache_usage_perc
    scraped_at: float | None = None       # monotonic time of the last successful scrape
    in_flight_at_scrape: int = 0


def effective_load(w: WorkerState, now: float, stale_after: float) -> float:
    if w.scraped_at is None or now - w.scraped_at > stale_after or w.waiting is None or w.running is None:
        return float(w.in_flight)
    others = max(0.0, (w.waiting + w.running) - w.in_flight_at_scrape)
    return w.in_flight + others


def jsq(workers: list[WorkerState], now: float, stale_after: float, rng: random.Random) -> WorkerState | None:
    live = [w for w in workers if w.healthy]
    if not live:
        return None
    loads = [effective_load(w, now, stale_after) for w in live]
    best = min(loads)
    return rng.choice([w for w, load in zip(live, loads) if load == best])


class RoundRobin:
    def __init__(self) -> None:
        self.i = 0

    def __call__(self, workers: list[WorkerState], now: float, stale_after: float, rng: random.Random):
        live = [w for w in workers if w.healthy]
        if not live:
            return None
        self.i += 1
        return live[self.i % len(live)]


def make_policy(name: str):
    if name == "jsq":
        return jsq
    if name == "round_robin":
        return RoundRobin()
    raise ValueError(f"unknown routing policy {name!r} (jsq, round_robin)")
