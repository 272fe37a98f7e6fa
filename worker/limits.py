"""Request-body size limit of the worker (an ASGI middleware).

A body larger than ``max_bytes`` gets an OpenAI-style 413 and is never held whole:
a ``Content-Length`` over the limit is refused before any byte is read, and a body
without one (chunked) is counted as it arrives and refused as soon as it passes the
limit (the ``HTTPException`` raised from ``receive`` reaches the app's handler).
"""

from __future__ import annotations

from starlette.exceptions import HTTPException

from worker.errors import APIError, error_response


class BodyLimit:
    def __init__(self, app, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        message = f"Request body exceeds {self.max_bytes} bytes."
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None:
            if not declared.strip().isdigit():
                await error_response(APIError(400, "The Content-Length header is not a number."))(scope, receive, send)
                return
            if int(declared) > self.max_bytes:
                await error_response(APIError(413, message, code="body_too_large"))(scope, receive, send)
                return
        received = 0

        async def counted():
            nonlocal received
            msg = await receive()
            if msg["type"] == "http.request":
                received += len(msg.get("body", b""))
                if received > self.max_bytes:
                    raise HTTPException(413, message)
            return msg

        await self.app(scope, counted, send)
