"""The gateway app's ASGI edges: JSON error handlers and the fast path for proxied POSTs.

``install_error_handlers`` makes every answer the gateway makes itself OpenAI-style JSON:
unknown routes (404), wrong methods (405), invalid requests (400), and an unexpected
exception (a JSON 500 with one log line). ``FastPath`` sends the proxied ``POST`` routes
straight to the proxy handler, skipping FastAPI's middleware and routing layers
(per-request and per-chunk cost); it refuses them with 503 while the gateway drains and
counts them in ``Drain.in_flight`` while they run.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from gateway.errors import error
from gateway.shutdown import Drain

log = logging.getLogger(__name__)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(StarletteHTTPException)
    async def _http(_req: Request, exc: StarletteHTTPException) -> JSONResponse:
        msg = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        return error(exc.status_code, msg, "invalid_request_error" if exc.status_code < 500 else "internal_error",
                     headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _validation(_req: Request, exc: RequestValidationError) -> JSONResponse:
        return error(400, "Invalid request.")

    @app.exception_handler(Exception)
    async def _unexpected(req: Request, exc: Exception) -> JSONResponse:
        log.error("unhandled %s on %s %s: %s", type(exc).__name__, req.method, req.url.path, exc)
        return error(500, f"Internal gateway error: {type(exc).__name__}", "internal_error")


class FastPath:
    """ASGI: the proxied ``POST`` routes (``PATHS``) straight to ``handler``
    (an unexpected exception is a JSON 500, as in the app's handler); the rest to ``app``."""

    PATHS = ("/v1/completions", "/v1/chat/completions", "/v1/responses", "/tokenize", "/detokenize")

    def __init__(self, app, handler, drain: Drain) -> None:
        self.app, self.handler, self.drain = app, handler, drain

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in self.PATHS:
            return await self.app(scope, receive, send)
        if self.drain.draining:         # gateway.shutdown: another replica takes it
            response = error(503, "The gateway is shutting down; retry.", "service_unavailable",
                             code="shutting_down", headers={"Retry-After": "1"})
            return await response(scope, receive, send)
        self.drain.in_flight += 1
        try:
            try:
                response = await self.handler(Request(scope, receive), scope["path"])
            except Exception as exc:  # noqa: BLE001 - the client gets JSON, the log one line
                log.error("unhandled %s on POST %s: %s", type(exc).__name__, scope["path"], exc)
                response = error(500, f"Internal gateway error: {type(exc).__name__}", "internal_error")
            await response(scope, receive, send)
        finally:
            self.drain.in_flight -= 1
