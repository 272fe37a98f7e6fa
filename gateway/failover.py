"""The pump of a migratable stream: relay events, and on a worker failure resume on another worker.

``Failover`` is the ``RelayedStream`` (gateway.relay) of one migratable request: its pump runs
the one relay loop over the current worker's stream, each run of events rewritten through the
stream's tracker (gateway.migration: any API's, through their one protocol; token ids stripped
unless asked for, ``id`` kept), with a stall timeout (``--stall-timeout``: mid-stream silence
counts as a failure). It reaches workers only through the ``Dispatcher`` (gateway.dispatch),
the same way the forwarder does. When the worker fails after the first byte it:

1. releases the failed dispatch as a worker failure (circuit breaker) and closes its
   upstream (so a live worker aborts the request);
2. picks another routable worker through the gateway's routing policy (prefix-aware
   routing sees the same prompt, so it prefers a worker that holds the prefix),
   excluding every worker this request has tried, and sends the continuation
   (the tracker's ``resume()``); up to ``max_attempts`` workers per migration, at most
   ``--max-migrations`` migrations per request;
3. accepts the new stream only if it is a 200 SSE that confirms the continuation
   (``x-swiftserve-continuation``), then relays it as the same stream. A worker that
   refuses the continuation (a 4xx, e.g. a vLLM worker asked to resume a constrained
   stream) is passed over for the next one without counting against its health; when
   none is left, the error event quotes the last refusal.

A stream whose tracker resumes it in parts is split (``_split``; completions' n > 1): each
unfinished choice is resumed as a leg of its own (an n = 1 continuation, the tracker's
``legs()``), the legs run side by side, each with its own copy of the tried workers and its
own later migrations, their events go to the client one send at a time, and the stream ends
with one summed usage chunk and ``[DONE]`` when every leg is over, or with the error event
if a leg could not go on.

If no migration is possible (limit reached, no other worker, a worker that does not send
token ids, the request already finished) the stream ends as a non-migratable one does:
one in-band error event and ``data: [DONE]`` (``give_up``); a stream whose generation had
already finished just gets its ``[DONE]``. An answer over ``max_response_bytes`` is never
resumed. ``finish(ok)`` of the current dispatch runs exactly once, from ``close()`` (the
response's cleanup).
"""

from __future__ import annotations

import asyncio
import logging

import orjson

from gateway.admission import Rejected
from gateway.migration import CONTINUATION_HEADER, Migrate, ResumableStream, rewrite
from gateway.relay import RelayedStream, body_message
from gateway.streaming import DONE, error_event
from gateway.upstream import RETRYABLE, AttemptFailed, transport_failure, worker_neutral

log = logging.getLogger(__name__)


class Failover(RelayedStream):
    """The relayed stream of one migratable request (``tracker``), able to move to another of ``workers``."""

    def __init__(self, dispatcher, session, path: str, choose, tried: set[str], tracker: ResumableStream,
                 lease, resp, first: bytes, stats, workers) -> None:
        super().__init__(dispatcher, lease, resp, first, stats)
        self.session, self.path, self.choose, self.tried = session, path, choose, tried
        self.workers = workers              # the request's model pool (gateway.pools)
        self.tracker = tracker
        self.legs: list[Failover] = []      # the parts it resumed as (``_split``)

    def _events(self, events: bytes):
        try:
            return rewrite(self.tracker, events)
        except ValueError:
            raise AttemptFailed("bad_event", "the worker sent an event that is not JSON") from None

    async def pump(self, send, chunk: bytes | None = None) -> None:
        chunk = self.first if chunk is None else chunk
        while True:
            try:
                await self.relay.run(send, self.resp, chunk, self._events)
                return
            except (Migrate, AttemptFailed, *RETRYABLE) as exc:
                failure = exc if isinstance(exc, (Migrate, AttemptFailed)) else transport_failure(exc)
            url, m = self.lease.worker.url, self.d.m
            too_large = failure.reason == "response_too_large"      # the answer itself: not resumable
            if self.tracker.finished and not too_large:
                log.warning("stream from %s failed after its finish (%s): ending it", url, failure.reason)
                if self.whole:                  # a leg's stream ends with the others (``_split``)
                    await send(body_message(DONE))
                return
            if too_large or not self.tracker.can_migrate():
                return await self.give_up(send, failure, "not migratable")
            log.warning("stream from %s failed after the first byte (%s): %s; migrating", url, failure.reason, failure)
            self.lease.finish(False)
            self.resp.close()
            self.tracker.migrations += 1
            legs = self.tracker.legs()
            if legs is not None:
                return await self._split(send, legs, failure.reason)
            try:
                chunk = await self._redispatch()
            except AttemptFailed as exc:
                m.migrations.labels(failure.reason, "failed").inc()
                return await self.give_up(send, exc, "migration failed")
            m.migrations.labels(failure.reason, "resumed").inc()

    async def _split(self, send, legs: list[ResumableStream], reason: str) -> None:
        """The stream's worker failed and its tracker resumes it as ``legs`` (an n > 1 stream's unfinished
        choices, each an n = 1 continuation): all at once, their events relayed as they come (one send at
        a time); then the tracker's ``summed_usage`` over the legs and ``[DONE]``, or, if a leg could not be
        resumed, the error event. Each leg may migrate again on its own."""
        lock = asyncio.Lock()

        async def one_at_a_time(msg) -> None:
            async with lock:
                await send(msg)

        self.legs = [Failover(self.d, self.session, self.path, self.choose, set(self.tried), leg, self.lease,
                              self.resp, b"", self.stats, self.workers) for leg in legs]
        for leg in self.legs:
            leg.whole = False
        await asyncio.gather(*(leg._resume_leg(one_at_a_time, reason) for leg in self.legs))
        failed = [leg.error for leg in self.legs if leg.failed]
        if failed:
            self.failed = True
            body = error_event(f"The worker failed during the stream: {failed[0]}", failed[0].reason)
        else:
            body = self.tracker.summed_usage([leg.tracker for leg in self.legs]) + DONE
        self.stats.feed(body)
        await send(body_message(body))

    async def _resume_leg(self, send, reason: str) -> None:
        try:
            chunk = await self._redispatch()
        except AttemptFailed as exc:
            self.d.m.migrations.labels(reason, "failed").inc()
            return await self.give_up(send, exc, "migration failed")
        self.d.m.migrations.labels(reason, "resumed").inc()
        await self.pump(send, chunk)

    async def _redispatch(self) -> bytes:
        """Start the continuation on another worker -> its first bytes; the new dispatch becomes current.
        Until then the current lease is the failed one, already finished (``close`` ignores it)."""
        d, last = self.d, AttemptFailed("no_worker", "no other worker to resume on", 503)
        for _ in range(d.cfg.max_attempts):
            try:
                lease = await d.lease(lambda: self.workers, self.choose, self.tried)
            except Rejected as exc:
                if last.reason != "no_worker":          # a worker was tried: its answer says more
                    raise last from None
                raise AttemptFailed("no_worker", f"no other worker to resume on ({exc})", exc.status) from None
            body, n = self.tracker.resume()
            resp = None
            try:
                resp = await d.post(lease, self.session, self.path, body)
                await _confirm(lease, resp, n)
                first = await d.first_bytes(lease, resp)
            except AttemptFailed as exc:
                last = exc
                log.warning("migration to %s failed (%s): %s", lease.worker.url, last.reason, last)
                if resp is not None and resp.status >= 500 and worker_neutral(resp):
                    raise last from None        # the request's own fault: it would fail the same way elsewhere
                continue
            self.lease, self.resp = lease, resp
            return first
        raise last

    def close(self) -> None:
        """Release the current dispatch (once) and its upstream connection, and those of the legs."""
        super().close()
        for leg in self.legs:
            leg.close()


async def _confirm(lease, resp, n: int) -> None:
    """A continuation's answer must be a 200 SSE confirming its ``n`` tokens (``x-swiftserve-continuation``;
    n = 0: a plain re-run). Else AttemptFailed, the response closed and the lease finished: a refusal (a 4xx,
    e.g. the continuation refused, or a 5xx the worker marks as the request's own fault) and a worker that
    does not resume say nothing about the worker's health."""
    try:
        if resp.status != 200 or not resp.headers.get("content-type", "").startswith("text/event-stream"):
            raise AttemptFailed(f"http_{resp.status}", f"HTTP {resp.status} to the continuation{await _refusal(resp)}")
        if n and resp.headers.get(CONTINUATION_HEADER) != str(n):
            raise AttemptFailed("no_continuation", "the worker does not resume generations "
                                                   "(no x-swiftserve-continuation header)")
    except AttemptFailed as exc:
        lease.finish(None if worker_neutral(resp) or exc.reason == "no_continuation" else False)
        resp.close()
        raise
    except BaseException:       # cancelled (the client left, shutdown)
        lease.finish(None)
        resp.close()
        raise


async def _refusal(resp) -> str:
    """": <the worker's error message>" of a JSON error answer (a refused continuation), else ""."""
    try:
        err = orjson.loads(await resp.content.read(4096)).get("error")
        return f": {err['message']}" if isinstance(err, dict) and isinstance(err.get("message"), str) else ""
    except Exception:  # noqa: BLE001 - only a better message is at stake
        return ""
