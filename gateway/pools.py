"""Model-aware pools: which worker serves which model, and the workers one request may use.

Contract:

* **Discovery** (``ModelDirectory.run``): every ``interval`` seconds (the health-check
  interval) each worker that passes its health checks is asked ``GET /v1/models``; the ids
  and entries it lists are kept on its ``WorkerState`` (``models``, ``model_cards``). A
  worker that fails to answer keeps what it listed before; one that has never answered
  (``models is None``) is in no pool. A worker restarted with another model moves to that
  model's pool at the next refresh; a request that finds no pool for its model first
  refreshes the workers at once (``ensure``), so a fresh gateway never refuses a model
  because its first refresh has not run yet.
* **Pools** (``ModelPool``): the workers of one model, a live view over the gateway's
  ``WorkerPool`` (a worker that joins, leaves or changes model is seen at once). Admission,
  the routing policy, retries and stream migration get the pool instead of every worker,
  so a request and its retries and migrations stay on workers of its model.
* ``served(now)``: the models at least one routable worker serves (what ``/v1/models``
  lists, each once, and what the 404 for an unknown model names); ``known()``: every model
  any worker has listed (the values the ``model`` label of the metrics may take).
"""

from __future__ import annotations

import asyncio
import logging
import time

import aiohttp

from gateway.routing.base import WorkerState

log = logging.getLogger(__name__)


class ModelPool:
    """The workers of ``pool`` (a ``WorkerPool``) that list ``model``; iterable like the pool itself."""

    def __init__(self, pool, model: str) -> None:
        self.pool, self.model = pool, model

    def __iter__(self):
        return iter([w for w in self.pool if w.models is not None and self.model in w.models])

    def __len__(self) -> int:
        return sum(1 for _ in self)


class ModelDirectory:
    def __init__(self, pool, interval: float = 1.0, timeout: float = 2.0) -> None:
        self.pool, self.interval, self.timeout = pool, interval, timeout
        self._refreshing: asyncio.Future | None = None      # one on-demand refresh at a time

    def of(self, model: str) -> ModelPool:
        return ModelPool(self.pool, model)

    def served(self, now: float) -> list[str]:
        """Models served by at least one routable worker, in the order workers list them."""
        seen: dict[str, None] = {}
        for w in self.pool:
            if w.models and w.routable(now):
                seen.update(dict.fromkeys(w.models))
        return list(seen)

    def known(self) -> set[str]:
        return {m for w in self.pool if w.models for m in w.models}

    def unknown(self) -> bool:
        """True while some worker has never listed its models."""
        return any(w.models is None for w in self.pool)

    def unlisted(self, now: float) -> bool:
        """True while some routable worker has never listed its models (it came up since the last refresh)."""
        return any(w.models is None and w.routable(now) for w in self.pool)

    def cards(self, now: float) -> list[dict]:
        """``/v1/models`` entries of the served models, each id once (the first worker's entry), by id."""
        seen, out = set(), []
        for w in self.pool:
            if not w.routable(now):
                continue
            for card in w.model_cards:
                if card.get("id") not in seen:
                    seen.add(card.get("id"))
                    out.append(card)
        return sorted(out, key=lambda c: c["id"])

    async def refresh_one(self, client: aiohttp.ClientSession, w: WorkerState) -> None:
        try:
            async with client.get(w.url + "/v1/models", timeout=aiohttp.ClientTimeout(total=self.timeout)) as r:
                if r.status != 200:
                    return
                doc = await r.json(content_type=None)
            cards = tuple(c for c in doc.get("data", []) if isinstance(c, dict) and isinstance(c.get("id"), str))
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError, AttributeError):
            return
        models = tuple(c["id"] for c in cards)
        if models != w.models:
            log.info("worker %s serves %s", w.url, ", ".join(models) or "no model")
        w.models, w.model_cards = models, cards

    async def refresh(self, client: aiohttp.ClientSession, only_healthy: bool = True) -> None:
        await asyncio.gather(*(self.refresh_one(client, w) for w in self.pool if w.healthy or not only_healthy))

    async def ensure(self, client: aiohttp.ClientSession, model: str) -> bool:
        """True when a routable worker serves ``model``, after refreshing every worker once if none did
        (concurrent callers share that refresh)."""
        if model in self.served(time.monotonic()):
            return True
        await self.refresh_shared(client)
        return model in self.served(time.monotonic())

    async def refresh_shared(self, client: aiohttp.ClientSession) -> None:
        """Refresh every worker once; concurrent callers share that refresh."""
        if self._refreshing is None:
            self._refreshing = asyncio.ensure_future(self.refresh(client, only_healthy=False))
            self._refreshing.add_done_callback(lambda _: setattr(self, "_refreshing", None))
        await asyncio.shield(self._refreshing)

    async def run(self, client: aiohttp.ClientSession) -> None:
        while True:
            await self.refresh(client)
            await asyncio.sleep(self.interval)
