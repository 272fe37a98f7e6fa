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
* An SSE stream passes through event by event, bytes unchanged (``RelayedStream``,
  gateway.relay); a failure after the first byte ends it with one in-band error event and
  ``data: [DONE]`` (the same form the worker uses for its own errors), never a re-send.
* A *migratable* stream (gateway.migration: completions, chat or Responses, when the request
  has a tracker) is relayed by ``gateway.failover.Failover`` instead: the same failures, a
  stall of ``stall_timeout`` seconds, a retryable worker error event or a drain abort move it
  to another worker with the tokens already sent as a continuation, and the client's stream
  goes on (same ``id``, nothing repeated or missing); only when no migration is possible
  does it end with the error event above.

Roles: ``Forwarder`` (here) decides attempts and answers and records the request's metrics;
dispatching to a worker is gateway.dispatch (shared with failover), reading and relaying the
answer gateway.relay, SSE bytes and the ASGI response gateway.streaming, the upstream client
and ``Lease`` gateway.upstream (aiohttp: C HTTP parser, pooled keep-alive connections, no
decompression: the bytes read are the bytes of the answer).

Accounting: ``Lease`` holds one dispatch; its ``finish(ok)`` runs exactly once however the
attempt ends (in the response's cleanup for streams) and reports the outcome to the circuit
breaker. A client that goes away is not the worker's fault. Closing the upstream response is
what tells the worker to abort.
"""

from __future__ import annotations

import logging
import time

import aiohttp
from fastapi.responses import Response

from gateway.admission import Rejected
from gateway.dispatch import Dispatcher
from gateway.errors import error
from gateway.failover import Failover
from gateway.migration import CONTINUATION_HEADER, ResumableStream
from gateway.relay import RelayedStream, read_whole
from gateway.streaming import SSEStream, StreamStats, is_json
from gateway.upstream import AttemptFailed, Lease, worker_neutral

log = logging.getLogger(__name__)
HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding", "date",
               "server"}


def _headers(resp: aiohttp.ClientResponse, drop: tuple[str, ...] = ()) -> dict[str, str]:
    return {k: v for k, v in resp.headers.items() if k.lower() not in HOP_HEADERS and k.lower() not in drop}


class Forwarder:
    def __init__(self, config, pool, health, admission, metrics, choose, rejected) -> None:
        self.cfg, self.pool, self.m, self.choose, self.rejected = config, pool, metrics, choose, rejected
        self.dispatcher = Dispatcher(config, pool, health, admission, metrics)

    async def forward(self, session: aiohttp.ClientSession, path: str, raw: bytes, on_usage, route=None,
                      tracker: ResumableStream | None = None, pool=None):
        """Send ``raw`` to a worker's ``path``; ``on_usage(completion_tokens)`` once a stream's usage is seen;
        ``route`` (a RouteRequest or None) is what the routing policy may know about the request;
        ``tracker``: the request's stream may migrate after the first byte (gateway.failover);
        ``pool``: the workers it may go to, retries and migrations included (gateway.pools; default all)."""
        workers = self.pool if pool is None else pool
        d, t0, tried, last = self.dispatcher, time.monotonic(), set(), None
        endpoint = path.rsplit("/", 1)[-1]
        choose = (lambda cands: self.choose(cands, route)) if route is not None else self.choose
        for attempt in range(self.cfg.max_attempts):
            try:
                lease = await d.lease(lambda: workers, choose, tried)
            except Rejected as exc:
                if attempt and exc.reason == "no_worker":
                    break
                return self.rejected(exc)
            if route is not None and route.cached_fraction is not None:
                self.m.prefix_cached.observe(route.cached_fraction)
            last_try = attempt + 1 >= self.cfg.max_attempts
            try:
                resp = await d.post(lease, session, path, raw)
            except AttemptFailed as exc:
                last = self._failed(lease, exc)
                continue
            try:
                if resp.headers.get("content-type", "").startswith("text/event-stream") and resp.status < 400:
                    first = await d.first_bytes(lease, resp)
                    if tracker is None:
                        relayed = RelayedStream(d, lease, resp, first, StreamStats(t0))
                    else:
                        relayed = Failover(d, session, path, choose, tried, tracker, lease, resp, first,
                                           StreamStats(t0), workers)
                    return self._stream(relayed, t0, endpoint, on_usage)
                return await self._whole(resp, lease, t0, endpoint, last_try)
            except AttemptFailed as exc:
                last = self._failed(lease, exc)
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

    def _failed(self, lease: Lease, exc: AttemptFailed) -> AttemptFailed:
        self.m.retries.labels(exc.reason).inc()
        log.warning("worker %s failed before the first byte (%s): %s", lease.worker.url, exc.reason, exc)
        return exc

    async def _whole(self, resp: aiohttp.ClientResponse, lease: Lease, t0: float, endpoint: str, last_try: bool):
        """A whole (non-SSE) answer, judged before anything is sent: a failure here is retried."""
        try:
            content = await read_whole(resp, self.cfg.max_response_bytes)
        except AttemptFailed:
            lease.finish(False)
            raise
        if content is None:
            lease.finish(True)
            self.m.requests.labels(endpoint, "502").inc()
            return error(502, f"The worker's answer exceeds {self.cfg.max_response_bytes} bytes.",
                         "upstream_error", code="response_too_large")
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

    def _stream(self, relayed: RelayedStream, t0: float, endpoint: str, on_usage) -> SSEStream:
        """The SSE response of ``relayed``; once it is over, its dispatch released and its metrics and usage."""
        resp, stats = relayed.resp, relayed.stats
        status = str(resp.status)

        async def on_close():
            relayed.close()
            self.m.requests.labels(endpoint, "502" if relayed.failed else status).inc()
            self.m.e2e.observe(time.monotonic() - t0)
            if stats.ttft is not None:
                self.m.ttft.observe(stats.ttft)
            if stats.tpot is not None:
                self.m.tpot.observe(stats.tpot)
            if stats.completion_tokens is not None:
                on_usage(stats.completion_tokens)

        drop = (CONTINUATION_HEADER,) if isinstance(relayed, Failover) else ()
        headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in _headers(resp, drop).items()]
        return SSEStream(resp.status, headers, relayed.pump, on_close)
