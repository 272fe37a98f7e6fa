"""The gateway's HTTP/1.1 connections: uvicorn's httptools protocol with a proxy's limits.

``edge_protocol(max_header_bytes, max_headers, header_timeout)`` is the protocol class the
gateway's server runs (``uvicorn.Config(http=...)``). Per request, before the app sees it:

* the request line and headers together may take at most ``max_header_bytes`` bytes and
  ``max_headers`` header lines; beyond either: 431 (the bytes are counted as they arrive, so a
  client sending megabytes of headers is cut off at the limit, never buffered whole);
* they must arrive within ``header_timeout`` seconds of the request's first byte (or of the
  connection, for a client that connects and sends nothing): else 408 (nothing received: the
  connection is just closed). Slow-header clients ("slowloris") cannot hold connections;
* malformed HTTP gets a JSON 400 (``{"error": {...}}`` with code ``bad_http``), as every other
  error of the gateway, instead of uvicorn's plain text.

Each of these answers closes the connection. The body's own limits (size, time) are
``gateway.edge``'s; idle keep-alive connections are uvicorn's (``timeout_keep_alive``).
"""

from __future__ import annotations

import json
from http import HTTPStatus

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class _Refused(Exception):
    """Raised from a parser callback: the request breaks a limit (the parser then stops)."""


def _answer(status: int, code: str, message: str) -> bytes:
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                 "code": code}}).encode()
    return (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode() + body


def edge_protocol(max_header_bytes: int, max_headers: int, header_timeout: float) -> type:
    """The protocol class with these limits (uvicorn instantiates it per connection)."""

    class EdgeProtocol(HttpToolsProtocol):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self._in_head = False           # between a request's first byte and the end of its headers
            self._head_bytes = 0            # of the current request's head, counted by the callbacks
            self._raw = 0                   # bytes received while its head was incomplete
            self._headers = 0
            self._timer = None
            self._refusal: tuple[int, str, str] | None = None

        # ---- the head's clock --------------------------------------------------------------------
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()                     # a client that connects and sends nothing is timed too

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._timer is None:
                self._timer = self.loop.call_later(header_timeout, self._timed_out)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _timed_out(self) -> None:
            self._timer = None
            if self.transport.is_closing():
                return
            if self._in_head:                   # the request had begun: it gets an answer
                self.transport.write(_answer(408, "header_timeout",
                                             f"The request's headers did not arrive within {header_timeout:g} s."))
            self.transport.close()

        # ---- counting --------------------------------------------------------------------------
        def _refuse(self, status: int, code: str, message: str) -> None:
            self._refusal = (status, code, message)
            raise _Refused(message)

        def _count(self, n: int) -> None:
            self._head_bytes += n
            if self._head_bytes > max_header_bytes:
                self._refuse(431, "headers_too_large",
                             f"The request line and headers exceed {max_header_bytes} bytes.")

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            # A header still arriving sits in the parser's buffer, unseen by the callbacks: while the head
            # is incomplete, every byte received counts (a chunk that completes it is counted exactly).
            if self._in_head and not self.transport.is_closing() and self._refusal is None:
                self._raw += len(data)
                if self._raw > max_header_bytes:
                    self._refusal = (431, "headers_too_large",
                                     f"The request line and headers exceed {max_header_bytes} bytes.")
                    self.send_400_response("")

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._in_head, self._head_bytes, self._raw, self._headers = True, 0, 0, 0
            self._arm()

        def on_url(self, url: bytes) -> None:
            self._count(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count(len(name) + len(value) + 4)
            self._headers += 1
            if self._headers > max_headers:
                self._refuse(431, "too_many_headers", f"The request has more than {max_headers} header lines.")
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._in_head = False
            self._disarm()
            super().on_headers_complete()

        # ---- answers ---------------------------------------------------------------------------
        def send_400_response(self, msg: str) -> None:
            status, code, message = self._refusal or (400, "bad_http", "Invalid HTTP request received.")
            self._disarm()
            self.transport.write(_answer(status, code, message))
            self.transport.close()

    return EdgeProtocol
