"""SSE bytes: how events are framed and checked, what they say, and the ASGI response that carries them.

Owns the byte-level rules every relay uses (gateway.relay, gateway.failover): ``event_end``
(complete events end in a blank line), ``valid_prefix`` / ``is_json`` (every ``data:``
payload is JSON, orjson first, or ``[DONE]``), ``stream_ended`` (a stream ends with
``data: [DONE]``, or for the Responses API with one of ``RESPONSES_TERMINAL``, the one list of
its terminal events), ``error_event`` (the in-band error and ``[DONE]`` that end a failed
stream, in the worker's own format).

``SSEStream`` is a raw ASGI response around a pump (``pump(send)`` sends the events) and an
``on_close()`` that runs exactly once however it ends. A watcher task waits for the client's
``http.disconnect`` and cancels the pump (the response's own task) at once (also during a
long silence such as a prefill), so the upstream is closed and the worker aborts.

``StreamStats`` looks for markers in the bytes sent as they pass: the first event carrying
generated text (TTFT), the last one (TPOT), ``usage.completion_tokens`` (or the Responses
API's ``output_tokens``).
"""

from __future__ import annotations

import asyncio
import json
import re
import time

import orjson
from starlette.responses import Response

TEXT = re.compile(rb'"(?:text|content|delta)"\s*:\s*"(?!")')
USAGE = re.compile(rb'"(?:completion|output)_tokens"\s*:\s*(\d+)')
DONE = b"data: [DONE]\n\n"
DONE_EVENTS = (DONE, b"data: [DONE]\r\n\r\n")
_BLOCKS = re.compile(rb"(?<=\n\n)|(?<=\r\n\r\n)")
# The Responses API ends a stream with one of its terminal events instead of [DONE] (the one list of them).
RESPONSES_TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})
_TERMINAL = re.compile(rb"event: (?:" + rb"|".join(re.escape(e.encode()) for e in sorted(RESPONSES_TERMINAL))
                       + rb")\r?\n")


def stream_ended(events: bytes) -> bool:
    """True when ``events`` (complete SSE events) ends with an event that ends a stream."""
    if events.endswith(DONE_EVENTS):
        return True
    body = events.rstrip(b"\r\n")
    lf, crlf = body.rfind(b"\n\n"), body.rfind(b"\r\n\r\n")
    start = max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)
    return _TERMINAL.match(body, start) is not None


def error_event(message: str, code: str) -> bytes:
    body = {"error": {"message": message, "type": "upstream_error", "param": None, "code": code}}
    return b"data: " + json.dumps(body).encode() + b"\n\n" + DONE     # the worker's own format


def event_end(buf: bytes) -> int:
    """Length of the prefix of ``buf`` made of complete SSE events (0 if none)."""
    return max(buf.rfind(b"\n\n") + 2, buf.rfind(b"\r\n\r\n") + 4, 0)


def is_json(content: bytes) -> bool:
    try:
        orjson.loads(content)
    except orjson.JSONDecodeError:
        try:                            # what orjson refuses but Python emits (NaN, -Infinity)
            json.loads(content)
        except (ValueError, RecursionError):
            return False
    return True


def valid_prefix(events: bytes) -> int:
    """Length of the leading run of well-formed events (each ``data:`` payload JSON or [DONE])."""
    pos = 0
    blocks = events.split(b"\n\n") if b"\r" not in events else _BLOCKS.split(events)
    sep = 2 if b"\r" not in events else 0
    for block in blocks:
        for line in block.splitlines():
            if line.startswith(b"data:"):
                payload = line[5:].strip()
                if payload != b"[DONE]" and not is_json(payload):
                    return pos
        pos += len(block) + sep
    return min(pos, len(events))


class StreamStats:
    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.completion_tokens: int | None = None
        self._tail = b""

    def feed(self, chunk: bytes) -> None:
        data = self._tail + chunk
        if TEXT.search(data):
            now = time.monotonic()
            self.first_token = self.first_token or now
            self.last_token = now
        if b"completion_tokens" in data or b"output_tokens" in data:     # chat/completions, Responses
            for m in USAGE.finditer(data):
                self.completion_tokens = int(m.group(1))
        self._tail = data[-64:]          # a marker may straddle two chunks

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.t0

    @property
    def tpot(self) -> float | None:
        n = self.completion_tokens
        if self.first_token is None or not n or n < 2:
            return None
        return (self.last_token - self.first_token) / (n - 1)


class SSEStream(Response):
    """ASGI response: ``pump(send)`` sends the events; ``on_close()`` runs once at the end.
    A Starlette ``Response`` only so that a FastAPI route may return it as is."""

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], pump, on_close) -> None:
        self.status_code, self.raw_headers, self.pump, self.on_close = status, headers, pump, on_close
        self.background = None
        self.client_gone = False

    async def __call__(self, scope, receive, send) -> None:
        me, pumping = asyncio.current_task(), True

        async def watch():                      # the client went away: stop the pump at once
            while True:
                if (await receive())["type"] == "http.disconnect":
                    # the server also says "disconnect" once the response is complete: not ours to cancel
                    if pumping:
                        self.client_gone = True
                        me.cancel()
                    return

        watcher = asyncio.ensure_future(watch())
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            await self.pump(send)
            pumping = False
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not self.client_gone:            # cancelled from outside (shutdown)
                raise
            if hasattr(me, "uncancel"):         # our own cancel (Python >= 3.11 counts them)
                me.uncancel()
        except OSError:                         # the client went away while we were writing
            self.client_gone = True
        finally:
            pumping = False
            watcher.cancel()
            await self.on_close()
