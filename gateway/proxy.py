"""Forwarding one accepted request to a worker: ``Forwarder.forward(...) -> Response``.

Contract: every accepted request ends with a complete answer or an explicit
OpenAI-style error, and the worker's in-flight count returns to zero.

* Before any byte reached the client, a connection error, a timeout (no byte for
  ``first_byte_timeout``; or no byte while the worker shows no sign of life, no passed
  health probe and no metrics scrape, for ``stall_timeout``: a hung worker), a 5xx, an
  empty stream or an unreadable answer is retried on another worker (``max_attempts``
  workers in all); then the client gets a 502/503/504 JSON error. A 5xx the worker marks
  as the request's own fault (``swiftcommon.faults``) is passed on as it is: not retried
  (another worker would fail the same way); neither it nor any 4xx counts for or against the
  worker in the circuit breaker.
* A non-streamed answer (any content type but ``text/event-stream``) is read whole, at
  most ``max_response_bytes``, before anything is sent: a worker that dies mid-body or
  answers 200 with something that is not JSON becomes a retry or a 502, never a
  truncated body.
* An SSE stream passes through event by event, bytes unchanged (an event is sent once
  its blank line has arrived, and only if its ``data:`` is JSON or ``[DONE]``). If the
  worker fails after the first byte (connection lost, no byte for ``stall_timeout``,
  an event that is not JSON, the stream ends without ``data: [DONE]`` (or, for
  /v1/responses, without its terminal ``response.completed|incomplete|failed`` event), or it exceeds
  ``max_response_bytes``), the client gets one error event
  ``data: {"error": {...}}`` and ``data: [DONE]``, and the stream ends cleanly (the
  same in-band form the worker uses for its own errors). Such a stream is never
  re-sent, so an answer is never duplicated.
* A *migratable* stream (gateway.migration: one streamed completion or chat choice) is
  relayed by ``gateway.failover.Failover`` instead: the same failures, a stall of
  ``stall_timeout`` seconds, a retryable worker error event or a drain abort move it to
  another worker with the tokens already sent as a continuation, and the client's stream
  goes on (same ``id``, nothing repeated or missing); only when no migration is possible
  does it end with the error event above.

Upstream I/O is aiohttp (C HTTP parser, pooled keep-alive connections, no
decompression: the bytes read are the bytes of the answer; gateway.upstream); SSE
pass-through lives in gateway.streaming, stream migration in gateway.failover.

Accounting: ``Lease`` (gateway.upstream) holds one dispatch; its ``finish(ok)`` runs exactly once however
the attempt ends (in the response's cleanup for streams) and reports the outcome to
the circuit breaker. A client that goes away is not the worker's fault. Closing the
upstream response is what tells the worker to abort.
"""

from __future__ import annotations

import asyncio
import logging
import time

import aiohttp
from fastapi.responses import Response
from yarl import URL

from gateway.admission import Rejected
from gateway.errors import error
from gateway.failover import Failover
from gateway.migration import CONTINUATION_HEADER, StreamTracker
from gateway.upstream import (RETRYABLE, UPSTREAM_HEADERS, AttemptFailed, Lease, close_upstream as _close,
                              transport_failure as _transport_failure, worker_neutral)
from gateway.streaming import SSEStream, StreamStats, error_event, event_end, is_json, stream_ended, valid_prefix

log = logging.getLogger(__name__)
HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding", "date",
               "server"}


def _headers(resp: aiohttp.ClientResponse) -> dict[str, str]:
    return {k: v for k, v in resp.headers.items() if k.lower() not in HOP_HEADERS}


class Forwarder:
    def __init__(self, config, pool, health, admission, metrics, choose, rejected) -> None:
        self.cfg, self.pool, self.health, self.admission = config, pool, health, admission
        self.m, self.choose, self.rejected = metrics, choose, rejected
        self._urls: dict[tuple[str, str], URL] = {}       # parsed once per (worker, path)

    def _url(self, base: str, path: str) -> URL:
        url = self._urls.get((base, path))
        if url is None:
            if len(self._urls) > 4096:
                self._urls.clear()
            url = self._urls[(base, path)] = URL(base + path)
        return url

    async def forward(self, session: aiohttp.ClientSession, path: str, raw: bytes, on_usage, route=None,
                      tracker: StreamTracker | None = None, pool=None):
        """Send ``raw`` to a worker's ``path``; ``on_usage(completion_tokens)`` once a stream's usage is seen;
        ``route`` (a RouteRequest or None) is what the routing policy may know about the request;
        ``tracker``: the request's stream may migrate after the first byte (gateway.failover);
        ``pool``: the workers it may go to, retries and migrations included (gateway.pools; default all)."""
        workers = self.pool if pool is None else pool
        t0, tried, last = time.monotonic(), set(), None
        endpoint = path.rsplit("/", 1)[-1]
        choose = (lambda cands: self.choose(cands, route)) if route is not None else self.choose
        for attempt in range(self.cfg.max_attempts):
            try:
                worker = await self.admission.acquire(lambda: workers, choose, tried)
            except Rejected as exc:
                if attempt and exc.reason == "no_worker":
                    break
                return self.rejected(exc)
            tried.add(worker.url)
            self.m.routed.labels(self.cfg.policy, worker.url).inc()
            if route is not None and route.cached_fraction is not None:
                self.m.prefix_cached.observe(route.cached_fraction)
            lease = Lease(worker, self.health, self.admission, self.pool)
            last_try = attempt + 1 >= self.cfg.max_attempts
            try:
                resp = await self.until_silent(session.post(self._url(worker.url, path), data=raw,
                                                            headers=UPSTREAM_HEADERS), worker)
            except (AttemptFailed, *RETRYABLE) as exc:
                lease.finish(False)
                last = self._failed(worker, exc if isinstance(exc, AttemptFailed) else _transport_failure(exc))
                continue
            except BaseException:
                lease.finish(None)
                raise
            try:
                if resp.headers.get("content-type", "").startswith("text/event-stream") and resp.status < 400:
                    failover = (session, path, choose, tried, tracker) if tracker is not None else None
                    return await self._stream(resp, lease, t0, endpoint, on_usage, failover, workers)
                return await self._buffered(resp, lease, t0, endpoint, last_try)
            except AttemptFailed as exc:
                last = self._failed(worker, exc)
                continue
            except BaseException:           # cancelled (shutdown): release, and close the upstream
                lease.finish(None)
                resp.close()
                raise
        self.m.rejected.labels("no_worker").inc()
        if last is None:
            return error(503, "No worker could take the request (none routable).", "service_unavailable",
                         code="no_worker", headers={"Retry-After": "1"})
        self.m.requests.labels(endpoint, str(last.status)).inc()
        return error(last.status, f"No worker could answer the request: {last}", "upstream_error", code=last.reason,
                     headers={"Retry-After": "1"})

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

    def _failed(self, worker, exc: AttemptFailed) -> AttemptFailed:
        self.m.retries.labels(exc.reason).inc()
        log.warning("worker %s failed before the first byte (%s): %s", worker.url, exc.reason, exc)
        return exc

    async def _buffered(self, resp: aiohttp.ClientResponse, lease: Lease, t0: float, endpoint: str, last_try: bool):
        """Read a whole (non-SSE) answer; a failure here is retried, since nothing was sent yet."""
        size, parts = 0, []
        try:
            async for chunk in resp.content.iter_any():
                size += len(chunk)
                if size > self.cfg.max_response_bytes:
                    lease.finish(True)
                    self.m.requests.labels(endpoint, "502").inc()
                    return error(502, f"The worker's answer exceeds {self.cfg.max_response_bytes} bytes.",
                                 "upstream_error", code="response_too_large")
                parts.append(chunk)
        except RETRYABLE as exc:
            lease.finish(False)
            raise _transport_failure(exc) from None
        finally:
            _close(resp)
        content = b"".join(parts)
        status = resp.status
        neutral = worker_neutral(resp)          # a 4xx or a request's own 5xx: never counted against the worker
        if status >= 500 and not last_try and not neutral:
            lease.finish(False)
            raise AttemptFailed(f"http_{status}", f"HTTP {status} from the worker", status)
        if not is_json(content):
            # Garbage: retried while attempts are left; then an OpenAI-style error, never the garbage.
            broken = status == 200 or status >= 500
            lease.finish(False if broken else None)
            message = f"the worker answered HTTP {status} with a body that is not JSON"
            if broken and not last_try:
                raise AttemptFailed("bad_answer", message)
            self.m.requests.labels(endpoint, str(502 if broken else status)).inc()
            return error(502 if broken else status, f"Invalid answer from the worker: {message}.",
                         "upstream_error", code="bad_answer")
        lease.finish(None if neutral else status < 500)      # a request's fault is not the worker's
        self.m.requests.labels(endpoint, str(status)).inc()
        self.m.e2e.observe(time.monotonic() - t0)
        return Response(content, status_code=status, headers=_headers(resp))

    async def _stream(self, resp: aiohttp.ClientResponse, lease: Lease, t0: float, endpoint: str, on_usage,
                      failover=None, workers=None):
        """The SSE response: events passed through as they are, or (``failover``: the session, path, choose,
        tried and tracker of a migratable request) relayed by a ``Failover`` that can change workers."""
        try:
            first = await self.until_silent(resp.content.readany(), lease.worker)
        except RETRYABLE as exc:
            resp.close()
            lease.finish(False)
            raise _transport_failure(exc) from None
        except AttemptFailed:
            resp.close()
            lease.finish(False)
            raise
        if not first:
            resp.close()
            lease.finish(False)
            raise AttemptFailed("empty_stream", "the worker ended the stream before any event")
        stats = StreamStats(t0)
        outcome = {"failed": False}
        limit, url, stall = self.cfg.max_response_bytes, lease.worker.url, self.cfg.stall_timeout
        if failover is not None:
            fo = Failover(self, *failover, lease, resp, first, stats, workers)
            return self._failover_stream(resp, fo, t0, endpoint, on_usage, stats)

        async def pump(send):
            pending, sent, ended, chunk = b"", 0, False, first
            try:
                while chunk:
                    stats.feed(chunk)
                    pending += chunk
                    cut = event_end(pending)
                    if cut:
                        out, pending = pending[:cut], pending[cut:]
                        sent += len(out)
                        if sent > limit:
                            raise AttemptFailed("response_too_large", f"the stream exceeds {limit} bytes")
                        good = valid_prefix(out)
                        if good < len(out):
                            if good:
                                await send({"type": "http.response.body", "body": out[:good], "more_body": True})
                            raise AttemptFailed("bad_event", "the worker sent an event that is not JSON")
                        ended = stream_ended(out)
                        await send({"type": "http.response.body", "body": out, "more_body": True})
                    chunk = await asyncio.wait_for(resp.content.readany(), stall)
                if not ended:
                    raise AttemptFailed("truncated_stream", "the worker ended the stream without [DONE]")
            except (AttemptFailed, *RETRYABLE) as exc:
                failure = exc if isinstance(exc, AttemptFailed) else _transport_failure(exc)
                outcome["failed"] = True
                self.m.retries.labels("after_first_byte_" + failure.reason).inc()
                log.warning("stream from %s failed after the first byte (%s): %s", url, failure.reason, failure)
                await send({"type": "http.response.body", "body": error_event(
                    f"The worker failed during the stream: {failure}", failure.reason), "more_body": True})

        async def on_close():
            lease.finish(not outcome["failed"])
            self._stream_ended(endpoint, "502" if outcome["failed"] else str(resp.status), t0, stats, on_usage)
            _close(resp)          # closing a stream cut short makes the worker abort

        headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in _headers(resp).items()]
        return SSEStream(resp.status, headers, pump, on_close)

    def _stream_ended(self, endpoint: str, status: str, t0: float, stats: StreamStats, on_usage) -> None:
        """A proxied stream's metrics and usage, once it is over (plain or with failover)."""
        self.m.requests.labels(endpoint, status).inc()
        self.m.e2e.observe(time.monotonic() - t0)
        if stats.ttft is not None:
            self.m.ttft.observe(stats.ttft)
        if stats.tpot is not None:
            self.m.tpot.observe(stats.tpot)
        if stats.completion_tokens is not None:
            on_usage(stats.completion_tokens)

    def _failover_stream(self, resp, fo: Failover, t0: float, endpoint: str, on_usage, stats: StreamStats):
        async def on_close():
            fo.close()
            self._stream_ended(endpoint, "502" if fo.failed else "200", t0, stats, on_usage)

        headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in _headers(resp).items()
                   if k.lower() != CONTINUATION_HEADER]
        return SSEStream(resp.status, headers, fo.pump, on_close)
