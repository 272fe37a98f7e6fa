"""The generation routes' bodies: parsed once, fast, and refused by cheap counts before validation.

``CountedRoute`` (the ``route_class`` of the worker's POST routes) reads a JSON body before
FastAPI does, parses it with orjson (the json module where orjson refuses a document: NaN, infinities,
nesting deeper than 1024, lone surrogate escapes, bad JSON; and where it has a run of 19 digits,
which an integer beyond 64 bits needs: orjson reads such an integer as a float), so every body
parses to what the json module would give, and bad JSON still gets FastAPI's own error,
and leaves the result where FastAPI reads it (``Request._json``), so the body is parsed once; the
parse runs with the cyclic garbage collector paused (``swiftcommon.gc_pause``: in the worker's
large heap, collections triggered by a body of many objects cost several times the parse).

Before FastAPI validates any item, ``check_counts`` refuses a list over its limit (``stop``
over ``--max-stop-strings``, ``tools`` over ``--max-tools``) with the same 400 that the later
checks give (``worker.limits.check_count``). Why: FastAPI validates the whole body (every tool,
every stop string, plus the text check of ``worker.protocol``) on the event loop before the
handler runs; for a 500,000-stop or 40,000-tool body that took 60-160 ms per request here
(``benchmarks/hostile_bench.py``; docs/reliability.md). What is not a list of the field's kind
is left to validation, which names the error as before.
"""

from __future__ import annotations

import json
from typing import Any, Callable

import orjson
from fastapi import Request
from fastapi.routing import APIRoute
from starlette.requests import ClientDisconnect

from swiftcommon.gc_pause import gc_paused
from worker.limits import RequestLimits, check_count

# (field, limit's attribute, what, flag): the lists counted before validation
COUNTED = (("stop", "max_stop_strings", "stop strings", "--max-stop-strings"),
           ("tools", "max_tools", "tools", "--max-tools"))


# Every digit -> "0", every other byte -> " ": a run of 19 zeros in the translation is a run of 19 digits,
# which an integer beyond 64 bits needs (orjson would read it as a float; the json module as an int).
_DIGITS = bytes(0x30 if 0x30 <= i <= 0x39 else 0x20 for i in range(256))
_LONG = b"0" * 19


def parse_json(raw: bytes) -> Any:
    """``json.loads(raw)``'s result, with orjson's speed where orjson reads the document as the json module
    does (not where it has 19 digits in a row, about 1.5 ms per MB to find out)."""
    if _LONG not in raw.translate(_DIGITS):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    return json.loads(raw)


def check_counts(body: Any, limits: RequestLimits) -> None:
    """400 for a counted list over its limit (a body that is not an object: validation's answer)."""
    if not isinstance(body, dict):
        return
    for key, attr, what, flag in COUNTED:
        value = body.get(key)
        if isinstance(value, list):
            check_count(len(value), getattr(limits, attr), what, flag, key)


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

        async def counted(request: Request):
            if _json_content(request):
                try:
                    raw = await request.body()
                except ClientDisconnect:            # FastAPI's own answer, as without this route class
                    return await handler(request)
                if raw:
                    try:
                        with gc_paused():
                            body = parse_json(raw)
                    except (ValueError, RecursionError):
                        body = None             # FastAPI parses it again and answers with its own error
                    else:
                        request._json = body    # what Request.json() returns: FastAPI does not parse again
                        check_counts(body, request.app.state.config.limits)
            return await handler(request)

        return counted
