"""Forwarding one accepted request to a worker: ``Forwarder.forward(...) -> Response``.

Contract: every accepted request ends with a complete answer or an explicit
OpenAI-style error, and the worker's in-flight count returns to zero.

* Before any byte reached the client, a connection error, a timeout (no byte for
  ``first_byte_timeout``), a 5xx, an empty stream or an unreadable answer is retried on
  another worker (``max_attempts`` workers in all); then the client gets a 502/503/504
  JSON error.
* A non-streamed answer (any content type but ``text/event-stream``) is read whole, at
  most ``max_response_bytes``, before anything is sent: a worker that dies mid-body or
  answers 200 with something that is not JSON becomes a retry or a 502, never a
  truncated body.
* An SSE stream passes through event by event, bytes unchanged (an event is sent once
  its blank line has arrived, and only if its ``data:`` is JSON or ``[DONE]``). If the
  worker fails after the first byte (connection lost, no byte for ``first_byte_timeout``,
  an event that is not JSON, the stream ends without ``data: [DONE]``, or it exceeds
  ``max_response_bytes``), the client gets one error event
  ``data: {"error": {...}}`` and ``data: [DONE]``, and the stream ends cleanly (the
  same in-band form the worker uses for its own errors). Nothing is retried after the
  first byte, so an answer is never duplicated.

Accounting: ``Lease`` holds one dispatch; its ``finish(ok)`` runs exactly once however
the attempt ends (in the response's cleanup for streams) and reports the outcome to
the circuit breaker. A client that goes away is not the worker's fault. Closing the
upstream response is what tells the worker to abort.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time

import httpx
from fastapi.responses import Response, StreamingResponse

from gateway.admission import Rejected
from gateway.errors import error
from gateway.streaming import StreamStats

log = logging.getLogger(__name__)
HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding"}
RETRYABLE = (httpx.TransportError, asyncio.TimeoutError)
# identity: the bytes read are the bytes of the answer (checked, counted, passed on)
UPSTREAM_HEADERS = {"content-type": "application/json", "accept-encoding": "identity"}
DONE_EVENTS = (b"data: [DONE]\n\n", b"data: [DONE]\r\n\r\n")


class AttemptFailed(Exception):
    """One worker could not answer; ``status`` is what the client gets if it was the last."""

    def __init__(self, reason: str, message: str, status: int = 502) -> None:
        super().__init__(message)
        self.reason, self.status = reason, status


def error_event(message: str, code: str) -> bytes:
    body = {"error": {"message": message, "type": "upstream_error", "param": None, "code": code}}
    return b"data: " + json.dumps(body).encode() + b"\n\ndata: [DONE]\n\n"


def _event_end(buf: bytes) -> int:
    """Length of the prefix of ``buf`` made of complete SSE events (0 if none)."""
    return max(buf.rfind(b"\n\n") + 2, buf.rfind(b"\r\n\r\n") + 4, 0)


class Lease:
    """One dispatch to one worker; ``finish`` releases it exactly once."""

    def __init__(self, worker, health, admission, pool) -> None:
        self.worker, self.health, self.admission, self.pool = worker, health, admission, pool
        self.done = False
        worker.in_flight += 1
        health.on_dispatch(worker, time.monotonic())

    def finish(self, ok: bool | None) -> None:
        """Release the dispatch; ``ok`` is reported to the circuit breaker (None: not the worker's doing)."""
        if self.done:
            return
        self.done = True
        self.worker.in_flight -= 1
        if ok is not None:
            self.health.on_result(self.worker, ok)
        else:
            self.worker.trial_in_flight = False
        self.admission.release()
        self.pool.reap()


class ProxiedStream(StreamingResponse):
    """A streamed upstream response whose cleanup runs however the response ends."""

    def __init__(self, content, on_close, **kw):
        super().__init__(content, **kw)
        self._on_close = on_close

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._on_close()


class Forwarder:
    def __init__(self, config, pool, health, admission, metrics, choose, rejected) -> None:
        self.cfg, self.pool, self.health, self.admission = config, pool, health, admission
        self.m, self.choose, self.rejected = metrics, choose, rejected

    async def forward(self, client: httpx.AsyncClient, path: str, raw: bytes, on_usage, route=None) -> Response:
        """Send ``raw`` to a worker's ``path``; ``on_usage(completion_tokens)`` once a stream's usage is seen;
        ``route`` (a RouteRequest or None) is what the routing policy may know about the request."""
        t0, tried, last = time.monotonic(), set(), None
        choose = (lambda cands: self.choose(cands, route)) if route is not None else self.choose
        endpoint = path.rsplit("/", 1)[-1]
        for attempt in range(self.cfg.max_attempts):
            try:
                worker = await self.admission.acquire(lambda: self.pool, choose, tried)
            except Rejected as exc:
                if attempt and exc.reason == "no_worker":
                    break
                return self.rejected(exc)
            tried.add(worker.url)
            self.m.routed.labels(self.cfg.policy, worker.url).inc()
            lease = Lease(worker, self.health, self.admission, self.pool)
            last_try = attempt + 1 >= self.cfg.max_attempts
            try:
                resp = await client.send(client.build_request("POST", worker.url + path, content=raw,
                                                              headers=UPSTREAM_HEADERS),
                                         stream=True)
            except RETRYABLE as exc:
                lease.finish(False)
                last = self._failed(worker, _transport_failure(exc))
                continue
            except BaseException:
                lease.finish(None)
                raise
            try:
                if resp.headers.get("content-type", "").startswith("text/event-stream") and resp.status_code < 400:
                    return await self._stream(resp, lease, t0, endpoint, on_usage)
                return await self._buffered(resp, lease, t0, endpoint, last_try)
            except AttemptFailed as exc:
                last = self._failed(worker, exc)
                continue
            except BaseException:           # cancelled (shutdown): release, and close the upstream
                lease.finish(None)
                await resp.aclose()
                raise
        self.m.rejected.labels("no_worker").inc()
        if last is None:
            return error(503, "No worker could take the request (none routable).", "service_unavailable",
                         code="no_worker", headers={"Retry-After": "1"})
        self.m.requests.labels(endpoint, str(last.status)).inc()
        return error(last.status, f"No worker could answer the request: {last}", "upstream_error", code=last.reason,
                     headers={"Retry-After": "1"})

    def _failed(self, worker, exc: AttemptFailed) -> AttemptFailed:
        self.m.retries.labels(exc.reason).inc()
        log.warning("worker %s failed before the first byte (%s): %s", worker.url, exc.reason, exc)
        return exc

    async def _buffered(self, resp: httpx.Response, lease: Lease, t0: float, endpoint: str, last_try: bool):
        """Read a whole (non-SSE) answer; a failure here is retried, since nothing was sent yet."""
        size, parts = 0, []
        try:
            async for chunk in resp.aiter_raw():
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
            await resp.aclose()
        content = b"".join(parts)
        status = resp.status_code
        if status >= 500 and not last_try:
            lease.finish(False)
            raise AttemptFailed(f"http_{status}", f"HTTP {status} from the worker", status)
        if not _is_json(content):
            # Garbage: retried while attempts are left; then an OpenAI-style error, never the garbage.
            broken = status == 200 or status >= 500
            lease.finish(not broken)
            message = f"the worker answered HTTP {status} with a body that is not JSON"
            if broken and not last_try:
                raise AttemptFailed("bad_answer", message)
            self.m.requests.labels(endpoint, str(502 if broken else status)).inc()
            return error(502 if broken else status, f"Invalid answer from the worker: {message}.",
                         "upstream_error", code="bad_answer")
        lease.finish(status < 500)
        self.m.requests.labels(endpoint, str(status)).inc()
        self.m.e2e.observe(time.monotonic() - t0)
        headers = {k: v for k, v in resp.headers.items() if k.lower() not in HOP_HEADERS}
        return Response(content, status_code=status, headers=headers)

    async def _stream(self, resp: httpx.Response, lease: Lease, t0: float, endpoint: str, on_usage):
        chunks = resp.aiter_raw()
        try:
            first = await chunks.__anext__()
        except StopAsyncIteration:
            first = b""
        except RETRYABLE as exc:
            await resp.aclose()
            lease.finish(False)
            raise _transport_failure(exc) from None
        if not first:
            await resp.aclose()
            lease.finish(False)
            raise AttemptFailed("empty_stream", "the worker ended the stream before any event")
        stats = StreamStats(t0)
        outcome = {"failed": False}
        limit, url = self.cfg.max_response_bytes, lease.worker.url

        async def body():
            pending, sent, ended = b"", 0, False
            try:
                async for chunk in _prepend(first, chunks):
                    stats.feed(chunk)
                    pending += chunk
                    cut = _event_end(pending)
                    if cut:
                        out, pending = pending[:cut], pending[cut:]
                        sent += len(out)
                        if sent > limit:
                            raise AttemptFailed("response_too_large", f"the stream exceeds {limit} bytes")
                        good = _valid_prefix(out)
                        if good < len(out):
                            if good:
                                yield out[:good]
                            raise AttemptFailed("bad_event", "the worker sent an event that is not JSON")
                        ended = out.endswith(DONE_EVENTS)
                        yield out
                if not ended:
                    raise AttemptFailed("truncated_stream", "the worker ended the stream without [DONE]")
            except (AttemptFailed, *RETRYABLE) as exc:
                failure = exc if isinstance(exc, AttemptFailed) else _transport_failure(exc)
                outcome["failed"] = True
                self.m.retries.labels("after_first_byte_" + failure.reason).inc()
                log.warning("stream from %s failed after the first byte (%s): %s", url, failure.reason, failure)
                yield error_event(f"The worker failed during the stream: {failure}", failure.reason)

        async def on_close():
            lease.finish(not outcome["failed"])
            self.m.requests.labels(endpoint, "502" if outcome["failed"] else str(resp.status_code)).inc()
            self.m.e2e.observe(time.monotonic() - t0)
            if stats.ttft is not None:
                self.m.ttft.observe(stats.ttft)
            if stats.tpot is not None:
                self.m.tpot.observe(stats.tpot)
            if stats.completion_tokens is not None:
                on_usage(stats.completion_tokens)
            await resp.aclose()          # closing the upstream stream makes the worker abort

        headers = {k: v for k, v in resp.headers.items() if k.lower() not in HOP_HEADERS}
        return ProxiedStream(body(), on_close, status_code=resp.status_code, headers=headers,
                             media_type=resp.headers.get("content-type"))


def _valid_prefix(events: bytes) -> int:
    """Length of the leading run of well-formed events (each ``data:`` payload JSON or [DONE])."""
    pos = 0
    for block in re.split(rb"(?<=\n\n)|(?<=\r\n\r\n)", events):
        for line in block.splitlines():
            if line.startswith(b"data:"):
                payload = line[5:].strip()
                if payload != b"[DONE]" and not _is_json(payload):
                    return pos
        pos += len(block)
    return pos


def _is_json(content: bytes) -> bool:
    try:
        json.loads(content)
    except (ValueError, RecursionError):
        return False
    return True


async def _prepend(first: bytes, rest):
    yield first
    async for chunk in rest:
        yield chunk


def _transport_failure(exc: BaseException) -> AttemptFailed:
    if isinstance(exc, (httpx.TimeoutException, asyncio.TimeoutError)):
        return AttemptFailed("timeout", f"{type(exc).__name__}: no answer in time", 504)
    return AttemptFailed(type(exc).__name__, f"{type(exc).__name__}: {exc or 'connection lost'}", 502)

