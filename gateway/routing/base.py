"""What every routing policy shares: the worker's state, its effective load, the request.

A policy is a callable ``(workers, now, stale_after, rng, req=None) -> WorkerState | None``:
a pure function of the workers' state (``WorkerState``, kept by health checks, the scraper and
the proxy), the monotonic time, the staleness limit of scraped figures, a random generator
(ties) and what is known of the request (``RouteRequest``). It considers only routable
workers and returns None when there is none. The policies themselves are in ``load`` and
``prefix_aware``; ``gateway.routing.make_policy`` picks one by name. Modules of this package
import this one and never each other.

Effective load: what this gateway has in flight to a worker now plus the load the worker
reported that is *not* ours:

    load = in_flight_now + max(0, (waiting + running)_scraped - in_flight_at_scrape)

Scraped figures lag (they are up to one scrape interval old, and a request we just
sent is not in them yet); our own in-flight count is exact and immediate, which is
what spreads a burst evenly. Subtracting the in-flight count observed at scrape time
avoids counting our own requests twice while still seeing load from other gateways
or clients. Figures older than ``stale_after`` are unknown: load = in_flight_now.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


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
    # model discovery (gateway.pools): the ids of the worker's GET /v1/models and its entries;
    # None until the first answer: such a worker is in no model's pool yet
    models: tuple[str, ...] | None = None
    model_cards: tuple[dict, ...] = ()
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


@dataclass
class RouteRequest:
    """What a policy may know about the request being routed."""
    hashes: list[int] = field(default_factory=list)
    prompt_bytes: int = 0
    session: str | None = None
    cached_fraction: float | None = None     # set by the policy: the chosen worker's recorded share


def pick_min(cands: list[WorkerState], key, rng: random.Random) -> WorkerState | None:
    """The candidate with the lowest ``key``; ties at random; None without candidates."""
    if not cands:
        return None
    vals = [key(w) for w in cands]
    best = min(vals)
    return rng.choice([w for w, v in zip(cands, vals) if v == best])
