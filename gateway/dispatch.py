"""Dispatch: one request body to one worker, up to its first bytes. Shared by the forwarder
(gateway.proxy: a client's request, retried before the first byte) and stream failover
(gateway.failover: a continuation on another worker).

``Dispatcher`` is their one public interface to the workers:

* ``lease(workers, choose, tried)``: a worker with room from ``workers()`` (the routing policy
  ``choose`` over the admission's candidates, never one in ``tried``; it is added to ``tried``)
  -> its ``Lease`` (gateway.upstream). Raises ``Rejected`` when none is routable or the queue is full.
* ``post(lease, session, path, body)`` -> the worker's response (headers read). A transport
  failure, a timeout or a silent worker raises ``AttemptFailed`` with the lease finished as the
  worker's failure.
* ``first_bytes(lease, resp)``: the first bytes of an SSE answer. Any failure, or a stream that
  ends before its first byte, raises ``AttemptFailed`` with the lease finished as the worker's
  failure and the response closed.
* ``until_silent(aw, worker)``: ``aw`` unless the worker shows no sign of life for ``stall_timeout``.

Invariant: whatever these raise, a lease they were given or made is finished exactly when the
exception leaves them (cancellation: finished as no one's fault, the response closed);
otherwise it is the caller's to finish.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
from yarl import URL

from gateway.upstream import RETRYABLE, UPSTREAM_HEADERS, AttemptFailed, Lease, transport_failure


class Dispatcher:
    def __init__(self, config, pool, health, admission, metrics) -> None:
        self.cfg, self.pool, self.health, self.admission, self.m = config, pool, health, admission, metrics
        self._urls: dict[tuple[str, str], URL] = {}       # parsed once per (worker, path)

    def url(self, base: str, path: str) -> URL:
        url = self._urls.get((base, path))
        if url is None:
            if len(self._urls) > 4096:
                self._urls.clear()
            url = self._urls[(base, path)] = URL(base + path)
        return url

    async def lease(self, workers, choose, tried: set[str]) -> Lease:
        """Admit the request to a worker of ``workers()`` it has not tried (raises ``Rejected``)."""
        worker = await self.admission.acquire(workers, choose, tried)
        tried.add(worker.url)
        self.m.routed.labels(self.cfg.policy, worker.url).inc()
        return Lease(worker, self.health, self.admission, self.pool)

    async def post(self, lease: Lease, session: aiohttp.ClientSession, path: str, body: bytes):
        """POST ``body`` to the leased worker's ``path`` -> its response, headers read."""
        worker = lease.worker
        try:
            return await self.until_silent(session.post(self.url(worker.url, path), data=body,
                                                        headers=UPSTREAM_HEADERS), worker)
        except (AttemptFailed, *RETRYABLE) as exc:
            lease.finish(False)
            raise exc if isinstance(exc, AttemptFailed) else transport_failure(exc) from None
        except BaseException:
            lease.finish(None)
            raise

    async def first_bytes(self, lease: Lease, resp: aiohttp.ClientResponse) -> bytes:
        """The first bytes of the SSE answer ``resp`` (never empty)."""
        try:
            first = await self.until_silent(resp.content.readany(), lease.worker)
        except (AttemptFailed, *RETRYABLE) as exc:
            resp.close()
            lease.finish(False)
            raise exc if isinstance(exc, AttemptFailed) else transport_failure(exc) from None
        except BaseException:       # cancelled (the client left, shutdown)
            lease.finish(None)
            resp.close()
            raise
        if not first:
            resp.close()
            lease.finish(False)
            raise AttemptFailed("empty_stream", "the worker ended the stream before any event")
        return first

    async def until_silent(self, aw, worker):
        """Await ``aw`` (a request to ``worker``, or a read of its answer) unless the worker shows no sign of
        life (no byte here, no passed health probe, no metrics scrape) for ``stall_timeout`` seconds: then
        AttemptFailed ``stalled`` (504). A worker that answers its probes may take as long as it needs
        (``first_byte_timeout`` bounds that)."""
        task = asyncio.ensure_future(aw)
        stall, since = self.cfg.stall_timeout, time.monotonic()
        try:
            while True:
                done, _ = await asyncio.wait((task,), timeout=stall / 4)
                if done:
                    return task.result()
                now = time.monotonic()
                alive = max(since, self.health.last_ok.get(worker.url, 0.0), worker.scraped_at or 0.0)
                if now - alive > stall:
                    raise AttemptFailed("stalled", f"no answer and no sign of life from the worker for {stall:g} s",
                                        504)
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
