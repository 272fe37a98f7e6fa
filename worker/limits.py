"""The worker's request limits: the body-size middleware, and the cheap limits checked
before a request costs anything (docs/reliability.md, "Limits").

``BodyLimit``: a body larger than ``max_bytes`` gets an OpenAI-style 413 and is never held
whole: a ``Content-Length`` over the limit is refused before any byte is read, and a body
without one (chunked) is counted as it arrives and refused as soon as it passes the limit
(the ``HTTPException`` raised from ``receive`` reaches the app's handler).

``RequestLimits`` (``WorkerConfig.limits``, from ``--max-prompt-bytes``, ``--max-stop-strings``,
``--max-tools``, ``--max-constraint-bytes``, ``--constraint-timeout``, ``--screen-body-bytes``; each flag's default
comes from ``SWIFTSERVE_<FLAG>``): what the edge refuses with a 400 naming the field before
tokenising or compiling anything. ``add_limit_flags`` / ``limits_from_args`` are the flags.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from starlette.exceptions import HTTPException

from swiftcommon import envs
from worker.errors import APIError, bad_request, error_response


@dataclass(frozen=True)
class RequestLimits:
    max_prompt_bytes: int = 0                   # prompt text bytes; 0: max_model_len x the longest token's bytes
    max_stop_strings: int = 64                  # stop strings per request
    max_tools: int = 128                        # tools per request (OpenAI's limit)
    max_constraint_bytes: int = 128 * 1024      # one constraint's text; tool_choice "required": all tools' schemas
    constraint_timeout: float = 2.0             # seconds to compile a constraint (and its first mask) at the edge
    screen_body_bytes: int = 512 * 1024         # bodies this large are first checked off the loop; 0: never


_FLAGS = (  # flag, field, help
    ("--max-prompt-bytes", "max_prompt_bytes",
     "prompt text longer than this many UTF-8 bytes (completions: each prompt; chat and responses: the messages' "
     "text) is refused with 400 before it is tokenised. 0: the most that can fit the context (max model length x "
     "the tokenizer's longest token in bytes; not applied with truncate_prompt_tokens)"),
    ("--max-stop-strings", "max_stop_strings", "stop strings per request at most (400 beyond)"),
    ("--max-tools", "max_tools", "tools per chat or responses request at most (400 beyond)"),
    ("--max-constraint-bytes", "max_constraint_bytes",
     "largest output constraint in bytes: a JSON schema, regex, grammar or choice list, one tool's parameters "
     "schema, and for tool_choice 'required' all tools' schemas together (400 beyond)"),
    ("--constraint-timeout", "constraint_timeout",
     "seconds a constraint may take to compile against the tokenizer (in a child process, with its first token "
     "mask); longer: 400"),
    ("--screen-body-bytes", "screen_body_bytes",
     "a generation request body of at least this many bytes is parsed, counted and validated first in a child "
     "process, so that a refused one never holds the event loop (worker.body_screen); 0: never"),
)


_ZERO_OK = ("max_prompt_bytes", "screen_body_bytes")


def check_count(n: int, limit: int, what: str, flag: str, param: str) -> None:
    """400 for ``n`` items of a list (``what``: "stop strings", "tools") over ``limit`` (``flag``)."""
    if n > limit:
        raise bad_request(f"{n} {what}; this server takes at most {limit} ({flag}).", param)


def add_limit_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("request limits (docs/reliability.md; defaults from SWIFTSERVE_<FLAG>)")
    d = RequestLimits()
    for flag, field, text in _FLAGS:
        default = getattr(d, field)
        var = "SWIFTSERVE_" + field.upper()
        try:
            default = envs.limit(var, default)
        except ValueError as exc:
            parser.error(str(exc))
        g.add_argument(flag, type=type(default), default=default, help=f"{text} (env {var})")


def limits_from_args(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None) -> RequestLimits:
    values = {field: getattr(args, field) for _, field, _ in _FLAGS}
    bad = [flag for flag, field, _ in _FLAGS if values[field] < 0 or (field not in _ZERO_OK and not values[field])]
    if bad and parser is not None:
        parser.error(f"{bad[0]} must be > 0 (--max-prompt-bytes, --screen-body-bytes: >= 0)")
    return RequestLimits(**values)


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
