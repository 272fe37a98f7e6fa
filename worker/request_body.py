"""The generation routes' bodies: parsed once, fast, and refused by cheap counts before validation.

``CountedRoute`` (the ``route_class`` of the worker's POST routes) reads a JSON body before
FastAPI does, parses it once with ``swiftcommon.json_body.parse_json`` (orjson's speed, the json
module's result, integers beyond 64 bits included; the collector paused), so bad JSON still gets
FastAPI's own error, and leaves the result where FastAPI reads it (``Request._json``).

Before FastAPI validates any item, ``check_counts`` refuses a list over its limit (``stop``
over ``--max-stop-strings``, ``tools`` over ``--max-tools``) with the same 400 that the later
checks give (``worker.limits.check_count``). Why: FastAPI validates the whole body (every tool,
every stop string, plus the text check of ``worker.api.base_request``) on the event loop before the
handler runs; for a 500,000-stop or 40,000-tool body that took 60-160 ms per request here
(``benchmarks/serve/hostile.py``; docs/reliability.md). What is not a list of the field's kind
is left to validation, which names the error as before.

A body of at least ``--screen-body-bytes`` is first offered to ``ServingState.screen``
(``worker.body_screen``): parsed, counted and validated in a child process, and refused from
there with the route's own answer, so that a hostile body never holds the event loop.
"""

from __future__ import annotations

from typing import Any, Callable

from fastapi import Request
from fastapi.routing import APIRoute
from starlette.requests import ClientDisconnect

from swiftcommon.json_body import parse_json
from worker.limits import RequestLimits, check_count

# (field, limit's attribute, what, flag): the lists counted before validation
COUNTED = (("stop", "max_stop_strings", "stop strings", "--max-stop-strings"),
           ("tools", "max_tools", "tools", "--max-tools"))


def model_ref(cls: type) -> str:
    """``module:qualname`` of a request model: how a screen child names the model to validate with."""
    return f"{cls.__module__}:{cls.__qualname__}"


def check_counts(body: Any, limits: RequestLimits) -> None:
    """400 for a counted list over its limit (a body that is not an object: validation's answer)."""
    if not isinstance(body, dict):
        return
    for key, attr, what, flag in COUNTED:
        value = body.get(key)
        if isinstance(value, list):
            check_count(len(value), getattr(limits, attr), what, flag, key)


def parse_counted(raw: bytes, limits: RequestLimits) -> Any:
    """``raw`` parsed once (None: not JSON, left to FastAPI's own answer), its counted lists checked
    (``check_counts``'s 400)."""
    try:
        body = parse_json(raw, big_ints="exact")
    except (ValueError, RecursionError):
        return None
    check_counts(body, limits)
    return body


def _json_content(request: Request) -> bool:
    """Whether FastAPI will read this body as JSON (no content type, or application/json or +json)."""
    ctype = request.headers.get("content-type")
    if not ctype:
        return True
    mime = ctype.split(";", 1)[0].strip().lower()
    return mime.startswith("application/") and (mime == "application/json" or mime.endswith("+json"))


class CountedRoute(APIRoute):
    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()
        fields = self.dependant.body_params
        # The request model a screen child validates the body with (one body parameter, not embedded).
        ref = model_ref(fields[0].field_info.annotation) if len(fields) == 1 else None

        async def counted(request: Request):
            if _json_content(request):
                try:
                    raw = await request.body()
                except ClientDisconnect:            # FastAPI's own answer, as without this route class
                    return await handler(request)
                screen = request.app.state.serving.screen
                if raw and ref is not None and screen.applies(len(raw)):
                    refused = await screen.refusal(ref, raw)
                    if refused is not None:
                        raise refused
                if raw:
                    body = parse_counted(raw, request.app.state.config.limits)
                    if body is not None:        # else FastAPI parses it again and answers with its own error
                        request._json = body    # what Request.json() returns: FastAPI does not parse again
            return await handler(request)

        return counted
