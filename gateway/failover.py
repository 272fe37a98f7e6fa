"""The pump of a migratable stream: relay events, and on a worker failure resume on another worker.

``Failover.pump(send)`` is the ``SSEStream`` pump of one migratable request
(gateway.migration). It relays the current worker's events through
``migration.rewrite`` (token ids stripped unless asked for, ``id`` kept) and reads with a
stall timeout (``--stall-timeout``: mid-stream silence counts as a failure). When the
worker fails after the first byte it:

1. releases the failed dispatch as a worker failure (circuit breaker) and closes its
   upstream (so a live worker aborts the request);
2. picks another routable worker through the gateway's routing policy (prefix-aware
   routing sees the same prompt, so it prefers a worker that holds the prefix),
   excluding every worker this request has tried, and sends the continuation
   (``StreamTracker.resume``); up to ``max_attempts`` workers per migration, at most
   ``--max-migrations`` migrations per request;
3. accepts the new stream only if it is a 200 SSE that confirms the continuation
   (``x-swiftserve-continuation``), then relays it as the same stream. A worker that
   refuses the continuation (a 4xx, e.g. a vLLM worker asked to resume a constrained
   stream) is passed over for the next one without counting against its health; when
   none is left, the error event quotes the last refusal.

An n > 1 stream whose worker fails is split (``_split``): each unfinished choice is resumed
as a leg of its own (an n = 1 continuation, ``StreamTracker.legs``), the legs run side by
side, each with its own copy of the tried workers and its own later migrations, their
events go to the client one send at a time, and the stream ends with one summed usage chunk
and ``[DONE]`` when every leg is over, or with the error event if a leg could not go on.

If no migration is possible (limit reached, no other worker, a worker that does not send
token ids, the request already finished) the stream ends as a non-migratable one does:
one in-band error event and ``data: [DONE]``; a stream whose choice had already finished
just gets its ``[DONE]``. ``finish(ok)`` of the current dispatch runs exactly once, from
``close()`` (the response's cleanup).
"""

from __future__ import annotations

import asyncio
import logging

import orjson

from gateway.admission import Rejected
from gateway.migration import CONTINUATION_HEADER, Migrate, StreamTracker, rewrite, summed_usage
from gateway.streaming import error_event, event_end
from gateway.upstream import (RETRYABLE, UPSTREAM_HEADERS, AttemptFailed, Lease, close_upstream, transport_failure,
                              worker_neutral)

log = logging.getLogger(__name__)


class Failover:
    def __init__(self, fwd, session, path: str, choose, tried: set[str], tracker: StreamTracker,
                 lease, resp, first: bytes, stats, workers=None) -> None:
        self.fwd, self.session, self.path, self.choose, self.tried = fwd, session, path, choose, tried
        self.workers = fwd.pool if workers is None else workers       # the request's model pool (gateway.pools)
        self.tracker, self.lease, self.resp, self.first, self.stats = tracker, lease, resp, first, stats
        self.failed = False
        self.error: AttemptFailed | Migrate | None = None      # why it gave up
        self.legs: list[Failover] = []      # an n > 1 stream's choices, resumed one by one (``_split``)
        self.size = 0

    async def _read(self) -> bytes:
        return await asyncio.wait_for(self.resp.content.readany(), self.fwd.cfg.stall_timeout)

    async def _relay(self, send, chunk: bytes) -> None:
        """Relay the current worker's stream until ``[DONE]``; raise on any failure."""
        pending = b""
        while chunk:
            pending += chunk
            cut = event_end(pending)
            if cut:
                events, pending = pending[:cut], pending[cut:]
                self.size += len(events)
                if self.size > self.fwd.cfg.max_response_bytes:
                    self.tracker.closed = True          # not resumable: the answer itself is too large
                    raise AttemptFailed("response_too_large", f"the stream exceeds {self.fwd.cfg.max_response_bytes}"
                                                          " bytes")
                try:
                    out, migrate, ended = rewrite(self.tracker, events)
                except ValueError:
                    raise AttemptFailed("bad_event", "the worker sent an event that is not JSON") from None
                if out:
                    self.stats.feed(out)
                    await send({"type": "http.response.body", "body": out, "more_body": True})
                if migrate is not None:
                    raise migrate
                if ended:
                    return
            chunk = await self._read()
        raise AttemptFailed("truncated_stream", "the worker ended the stream without [DONE]")

    async def pump(self, send, chunk: bytes | None = None) -> None:
        chunk = self.first if chunk is None else chunk
        while True:
            try:
                await self._relay(send, chunk)
                return
            except (Migrate, AttemptFailed, *RETRYABLE) as exc:
                failure = exc if isinstance(exc, (Migrate, AttemptFailed)) else transport_failure(exc)
            url, m = self.lease.worker.url, self.fwd.m
            if self.tracker.finished and failure.reason != "response_too_large":
                log.warning("stream from %s failed after its finish (%s): ending it", url, failure.reason)
                if self.tracker.index is None:          # a leg's stream ends with the others (``_split``)
                    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": True})
                return
            if not self.tracker.can_migrate():
                return await self._give_up(send, failure, "not migratable")
            log.warning("stream from %s failed after the first byte (%s): %s; migrating", url, failure.reason, failure)
            self.lease.finish(False)
            self.resp.close()
            self.tracker.migrations += 1
            if len(self.tracker.choices) > 1:
                return await self._split(send, failure.reason)
            try:
                chunk = await self._redispatch()
            except AttemptFailed as exc:
                m.migrations.labels(failure.reason, "failed").inc()
                return await self._give_up(send, exc, "migration failed")
            m.migrations.labels(failure.reason, "resumed").inc()

    async def _split(self, send, reason: str) -> None:
        """An n > 1 stream's worker failed: resume each unfinished choice as a leg of its own (an n = 1
        continuation, ``StreamTracker.legs``), all at once, their events relayed as they come (one send at
        a time); then one usage chunk summed over the choices and ``[DONE]``, or, if a leg could not be
        resumed, the error event. Each leg may migrate again on its own."""
        lock = asyncio.Lock()

        async def one_at_a_time(msg) -> None:
            async with lock:
                await send(msg)

        self.legs = [Failover(self.fwd, self.session, self.path, self.choose, set(self.tried), leg, self.lease,
                              self.resp, b"", self.stats, self.workers) for leg in self.tracker.legs()]
        await asyncio.gather(*(leg._resume_leg(one_at_a_time, reason) for leg in self.legs))
        failed = [leg.error for leg in self.legs if leg.failed]
        if failed:
            self.failed = True
            body = error_event(f"The worker failed during the stream: {failed[0]}", failed[0].reason)
        else:
            body = summed_usage(self.tracker, [leg.tracker for leg in self.legs]) + b"data: [DONE]\n\n"
        self.stats.feed(body)
        await send({"type": "http.response.body", "body": body, "more_body": True})

    async def _resume_leg(self, send, reason: str) -> None:
        try:
            chunk = await self._redispatch()
        except AttemptFailed as exc:
            self.fwd.m.migrations.labels(reason, "failed").inc()
            return await self._give_up(send, exc, "migration failed")
        self.fwd.m.migrations.labels(reason, "resumed").inc()
        await self.pump(send, chunk)

    async def _give_up(self, send, failure, why: str) -> None:
        self.failed, self.error = True, failure
        self.fwd.m.retries.labels("after_first_byte_" + failure.reason).inc()
        log.warning("stream from %s ends with an error (%s; %s): %s", self.lease.worker.url, failure.reason, why,
                    failure)
        if self.tracker.index is None:          # a leg's error ends the stream once every leg is over
            await send({"type": "http.response.body", "body": error_event(
                f"The worker failed during the stream: {failure}", failure.reason), "more_body": True})

    async def _redispatch(self) -> bytes:
        """Start the continuation on another worker -> its first bytes; the new dispatch becomes current.
        Until then the current lease is the failed one, already finished (``close`` ignores it)."""
        fwd, last = self.fwd, AttemptFailed("no_worker", "no other worker to resume on", 503)
        for _ in range(fwd.cfg.max_attempts):
            try:
                worker = await fwd.admission.acquire(lambda: self.workers, self.choose, self.tried)
            except Rejected as exc:
                if last.reason != "no_worker":          # a worker was tried: its answer says more
                    raise last from None
                raise AttemptFailed("no_worker", f"no other worker to resume on ({exc})", exc.status) from None
            self.tried.add(worker.url)
            fwd.m.routed.labels(fwd.cfg.policy, worker.url).inc()
            lease = Lease(worker, fwd.health, fwd.admission, fwd.pool)
            body, n = self.tracker.resume()
            resp = None
            try:
                resp = await fwd.until_silent(self.session.post(fwd._url(worker.url, self.path), data=body,
                                                                headers=UPSTREAM_HEADERS), worker)
                confirmed = n == 0 or resp.headers.get(CONTINUATION_HEADER) == str(n)
                if resp.status != 200 or not resp.headers.get("content-type", "").startswith("text/event-stream"):
                    raise AttemptFailed(f"http_{resp.status}", f"HTTP {resp.status} to the continuation"
                                                               f"{await _refusal(resp)}")
                if not confirmed:
                    raise AttemptFailed("no_continuation", "the worker does not resume generations "
                                                           "(no x-swiftserve-continuation header)")
                first = await fwd.until_silent(resp.content.readany(), worker)
                if not first:
                    raise AttemptFailed("empty_stream", "the worker ended the stream before any event")
            except (AttemptFailed, *RETRYABLE) as exc:
                last = exc if isinstance(exc, AttemptFailed) else transport_failure(exc)
                # a 4xx (e.g. the continuation refused) or a 5xx the worker marks as the request's own fault
                # says nothing about the worker's health; the latter would fail the same way elsewhere
                neutral = resp is not None and worker_neutral(resp)
                request_fault = neutral and resp.status >= 500
                lease.finish(None if neutral or last.reason == "no_continuation" else False)
                if resp is not None:
                    resp.close()
                log.warning("migration to %s failed (%s): %s", worker.url, last.reason, last)
                if request_fault:
                    raise last from None
                continue
            except BaseException:       # cancelled (the client left, shutdown)
                lease.finish(None)
                if resp is not None:
                    resp.close()
                raise
            self.lease, self.resp = lease, resp
            return first
        raise last

    def close(self) -> None:
        """Release the current dispatch (once) and its upstream connection, and those of the legs."""
        self.lease.finish(not self.failed)
        close_upstream(self.resp)
        for leg in self.legs:
            leg.close()


async def _refusal(resp) -> str:
    """": <the worker's error message>" of a JSON error answer (a refused continuation), else ""."""
    try:
        err = orjson.loads(await resp.content.read(4096)).get("error")
        return f": {err['message']}" if isinstance(err, dict) and isinstance(err.get("message"), str) else ""
    except Exception:  # noqa: BLE001 - only a better message is at stake
        return ""
