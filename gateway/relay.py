"""Relay: a worker's answer to the client, the one loop for both kinds of body.

Owns:

* ``read_whole(resp, limit)``: a non-streamed answer read whole before anything is sent (at most
  ``limit`` bytes; None beyond), so that a worker that dies mid-body becomes a retry, never a
  truncated body. gateway.proxy judges what was read.
* ``Relay.run(send, resp, chunk, events)``: the SSE loop. It reads the worker's stream (no byte
  for ``stall_timeout``: a failure), cuts it into complete events (an event is sent once its
  blank line has arrived), counts the bytes against ``max_response_bytes`` (across every worker
  of one stream) and hands each run of events to ``events``, which says what the client gets,
  whether it failed and whether the stream ended. It raises on any failure and never writes an
  error itself. Used by ``RelayedStream`` below (``passthrough``) and by gateway.failover (the
  events rewritten through the stream's tracker, gateway.migration).
* ``RelayedStream``: the pump and close of one SSE answer that cannot migrate: bytes unchanged
  (each ``data:`` checked to be JSON or ``[DONE]``); a failure after the first byte (connection
  lost, a stall, an event that is not JSON, the stream ends without ``data: [DONE]`` or, for
  /v1/responses, without its terminal event, or it exceeds ``max_response_bytes``) ends it with
  one in-band error event and ``data: [DONE]`` (``give_up``). Such a stream is never re-sent,
  so an answer is never duplicated.

Invariants: the client gets only complete events, each at most once; ``close()`` finishes the
current dispatch exactly once (a worker failure if the stream gave up) and closes its upstream
(a stream cut short makes the worker abort).
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp

from gateway.streaming import error_event, event_end, stream_ended, valid_prefix
from gateway.upstream import RETRYABLE, AttemptFailed, close_upstream, transport_failure

log = logging.getLogger(__name__)


def body_message(body: bytes) -> dict:
    return {"type": "http.response.body", "body": body, "more_body": True}


async def read_whole(resp: aiohttp.ClientResponse, limit: int) -> bytes | None:
    """The whole body of ``resp`` (closed or released after), None if it exceeds ``limit`` bytes;
    a transport failure raises AttemptFailed."""
    size, parts = 0, []
    try:
        async for chunk in resp.content.iter_any():
            size += len(chunk)
            if size > limit:
                return None
            parts.append(chunk)
    except RETRYABLE as exc:
        raise transport_failure(exc) from None
    finally:
        close_upstream(resp)
    return b"".join(parts)


def passthrough(events: bytes) -> tuple[bytes, AttemptFailed | None, bool]:
    """Complete events of a stream that cannot migrate -> (the well-formed ones, unchanged; a failure
    after them; whether they end the stream)."""
    good = valid_prefix(events)
    if good < len(events):
        return events[:good], AttemptFailed("bad_event", "the worker sent an event that is not JSON"), False
    return events, None, stream_ended(events)


class Relay:
    """The SSE loop of one client stream; ``size`` counts what every worker of it sent."""

    def __init__(self, limit: int, stall: float, stats) -> None:
        self.limit, self.stall, self.stats = limit, stall, stats
        self.size = 0

    async def run(self, send, resp: aiohttp.ClientResponse, chunk: bytes, events, to_eof: bool = False) -> None:
        """Relay ``resp`` (``chunk``: what was read of it already) until the stream's end; raise on a failure.
        ``to_eof``: read on after the end until the worker closes the body (its connection goes back to
        the pool), and judge the end by the last events."""
        pending, ended = b"", False
        while chunk:
            pending += chunk
            cut = event_end(pending)
            if cut:
                block, pending = pending[:cut], pending[cut:]
                self.size += len(block)
                if self.size > self.limit:
                    raise AttemptFailed("response_too_large", f"the stream exceeds {self.limit} bytes")
                out, failure, ended = events(block)
                if out:
                    self.stats.feed(out)
                    await send(body_message(out))
                if failure is not None:
                    raise failure
                if ended and not to_eof:
                    return
            chunk = await asyncio.wait_for(resp.content.readany(), self.stall)
        if not ended:
            raise AttemptFailed("truncated_stream", "the worker ended the stream without [DONE]")


class RelayedStream:
    """The ``SSEStream`` pump and close of one SSE answer (``lease``, ``resp``, its ``first`` bytes)."""

    def __init__(self, dispatcher, lease, resp, first: bytes, stats) -> None:
        self.d, self.lease, self.resp, self.first, self.stats = dispatcher, lease, resp, first, stats
        self.relay = Relay(dispatcher.cfg.max_response_bytes, dispatcher.cfg.stall_timeout, stats)
        self.failed = False
        self.error: Exception | None = None        # why it gave up
        self.whole = True                           # the client's stream (False: a leg, gateway.failover)

    async def pump(self, send) -> None:
        try:
            await self.relay.run(send, self.resp, self.first, passthrough, to_eof=True)
        except (AttemptFailed, *RETRYABLE) as exc:
            await self.give_up(send, exc if isinstance(exc, AttemptFailed) else transport_failure(exc), "no failover")

    async def give_up(self, send, failure, why: str) -> None:
        """End the stream with the error event (a leg's error is its split stream's to send)."""
        self.failed, self.error = True, failure
        self.d.m.retries.labels("after_first_byte_" + failure.reason).inc()
        log.warning("stream from %s ends with an error (%s; %s): %s", self.lease.worker.url, failure.reason, why,
                    failure)
        if self.whole:
            body = error_event(f"The worker failed during the stream: {failure}", failure.reason)
            await send(body_message(body))

    def close(self) -> None:
        """Release the current dispatch (once) and its upstream connection."""
        self.lease.finish(not self.failed)
        close_upstream(self.resp)
