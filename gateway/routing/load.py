"""The load-only routing policies: ``jsq``, ``p2c``, ``kv`` and ``round_robin``.

- ``jsq`` (join-shortest-queue): the lowest effective load (``base.effective_load``).
- ``p2c`` (power of two choices): the less loaded of two random routable workers.
- ``kv``: JSQ on load plus KV-cache occupancy, so that among equally loaded workers the one
  with the emptiest cache wins and a nearly full cache (> 95%) is avoided while any other
  worker has room.
- ``round_robin``: the next routable worker.
Only routable workers are considered (healthy, circuit not open, not draining); ties are
broken at random.
"""

from __future__ import annotations

from gateway.routing.base import effective_load, pick_min


def jsq(workers, now, stale_after, rng, req=None):
    return pick_min([w for w in workers if w.routable(now)], lambda w: effective_load(w, now, stale_after), rng)


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

    return pick_min(cands, key, rng)


class RoundRobin:
    def __init__(self) -> None:
        self.i = 0

    def __call__(self, workers, now, stale_after, rng, req=None):
        live = [w for w in workers if w.routable(now)]
        if not live:
            return None
        self.i += 1
        return live[self.i % len(live)]
