"""The ``prefix`` routing policy: expected cached prefix vs effective load, bounded load.

For each request the gateway renders the prompt and hashes it into block-chained
prefix hashes (gateway.prefix). Among routable workers:

1. **Bounded load** (consistent hashing with bounded loads): with ``n`` workers and
   total effective load ``L`` (gateway.routing.base.effective_load: this replica's
   in-flight plus what the worker reports from elsewhere), a worker may take the
   request only if afterwards its load is at most
   ``max(ceil((1 + eps) * (L + 1) / n), floor)``. The absolute ``floor`` (default 2)
   keeps affinity at low load, where the relative bound alone would be below 2 and
   send every second request of a prefix to a cold worker.
   No prefix, however hot, can push a worker beyond that: it spills to the next
   best worker, which then learns the prefix too (hot prefixes get replicated).
2. **Session affinity** (optional): a request carrying the session header goes to
   the session's home worker (rendezvous hashing of the session id over the
   routable workers: stable across gateway replicas and under worker churn) when
   the bound allows it.
3. **Score**: ``cost = load_weight * load - trust * cached_fraction``, where
   ``cached_fraction`` is the share of the prompt's bytes covered by the longest
   prefix this worker was sent recently (PrefixIndex), and ``trust`` (0..1) is how
   well that prediction matched the worker's own prefix-cache counters
   (``vllm:prefix_cache_hits`` / ``vllm:prefix_cache_queries``) when it exports
   them. Lowest cost wins; ties go to the worker holding the fewest recorded blocks
   (new prefixes spread evenly), then at random. With no prefix match anywhere this
   is JSQ (lowest effective load), with that tie-break.

After a decision the chosen worker is recorded as holding the request's blocks.
A worker whose prefix-cache counters go backwards (restart) loses its record; one
that reports its cache size (``vllm:cache_config_info``) bounds its record to it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from hashlib import blake2b

from gateway.prefix import PrefixIndex
from gateway.routing.base import RouteRequest, effective_load

BYTES_PER_TOKEN = 4          # estimate, to turn a worker's cache size in tokens into our blocks


def rendezvous(key: str, urls: list[str]) -> str:
    """Highest-random-weight owner of ``key`` among ``urls`` (same answer in every process)."""
    return max(urls, key=lambda u: blake2b(f"{key}\x00{u}".encode(), digest_size=8).digest())


def load_bound(loads: list[float], eps: float, floor: float = 2.0) -> float:
    """The most load any worker may carry after taking one more request."""
    return max(math.ceil((1.0 + eps) * (sum(loads) + 1.0) / len(loads)), floor)


@dataclass
class _Trust:
    queries: float | None = None
    hits: float | None = None
    predicted_hit: float = 0.0
    predicted_total: float = 0.0
    value: float = 1.0


class PrefixAware:
    def __init__(self, index: PrefixIndex, block_bytes: int = 128, eps: float = 0.5, load_weight: float = 0.25,
                 floor: float = 2.0):
        self.index, self.block_bytes, self.eps, self.load_weight = index, block_bytes, eps, load_weight
        self.floor = floor
        self.trust: dict[str, _Trust] = {}

    def forget(self, url: str) -> None:
        self.index.forget(url)
        self.trust.pop(url, None)

    def _refresh(self, w) -> float:
        """Reconcile our predictions with the worker's prefix-cache counters; return its trust."""
        t = self.trust.setdefault(w.url, _Trust())
        if w.cache_tokens:
            self.index.set_capacity(w.url, w.cache_tokens * BYTES_PER_TOKEN // self.block_bytes)
        q, h = w.prefix_queries, w.prefix_hits
        if q is None or h is None or (q, h) == (t.queries, t.hits):
            return t.value
        if t.queries is not None and (q < t.queries or h < t.hits):
            self.index.forget(w.url)                 # counters reset: the worker restarted, its cache is empty
        elif t.queries is not None and q > t.queries and t.predicted_total > 0:
            predicted = t.predicted_hit / t.predicted_total
            if predicted > 0.05:
                actual = (h - t.hits) / (q - t.queries)
                t.value = 0.7 * t.value + 0.3 * min(1.0, actual / predicted)
        t.queries, t.hits, t.predicted_hit, t.predicted_total = q, h, 0.0, 0.0
        return t.value

    def __call__(self, workers, now, stale_after, rng, req: RouteRequest | None = None):
        live = [w for w in workers if w.routable(now)]
        if not live:
            return None
        loads = [effective_load(w, now, stale_after) for w in live]
        bound = load_bound(loads, self.eps, self.floor)
        allowed = [i for i, load in enumerate(loads) if load + 1 <= bound] or \
                  [i for i, load in enumerate(loads) if load == min(loads)]
        req = req or RouteRequest()
        if req.session:
            home = rendezvous(req.session, [w.url for w in live])
            for i in allowed:
                if live[i].url == home:
                    return self._record(live[i], req, self.index.match(home, req.hashes, now), now)
        best, best_key, best_match = [], None, 0
        for i in allowed:
            w = live[i]
            m = self.index.match(w.url, req.hashes, now) if req.hashes else 0
            frac = min(1.0, m * self.block_bytes / req.prompt_bytes) if m else 0.0
            cost = self.load_weight * loads[i] - self._refresh(w) * frac
            key = (cost, self.index.size(w.url))
            if best_key is None or key < best_key:
                best, best_key, best_match = [w], key, m
            elif key == best_key:
                best.append(w)
        return self._record(rng.choice(best), req, best_match, now)

    def _record(self, w, req: RouteRequest, matched: int, now: float):
        req.cached_fraction = min(1.0, matched * self.block_bytes / req.prompt_bytes) if matched else 0.0
        if req.hashes:
            self.index.insert(w.url, req.hashes, now)
            t = self.trust.setdefault(w.url, _Trust())
            t.predicted_hit += matched * self.block_bytes
            t.predicted_total += max(req.prompt_bytes, 1)
        return w
