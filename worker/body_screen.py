"""Large request bodies refused in a child process, so that their parse never holds the event loop.

Why: parsing a multi-megabyte JSON body (500,000 stop strings, 40,000 tools) and validating it
takes 30-60 ms of one core, and orjson and pydantic hold the GIL, so a thread would not free the
loop: every other request of the worker (each of its streamed tokens included) waited that long
(docs/reliability.md, issue 47). A body of at least ``--screen-body-bytes`` (default 512 KiB; 0:
never) is first sent to a child (``python -m worker.body_screen``, a ``worker.child_process.LineChild``
at background CPU priority), which runs the checks that need nothing but the body and the
limits, in the order the route runs them:

1. the JSON parse (``swiftcommon.json_body.parse_json``; bad JSON and a body that is not an object
   are left to the route, which answers them as before);
2. the counted lists (``stop``, ``tools``); 1 and 2 are the route's own step
   (``worker.request_body.parse_counted``);
3. the route's request model, validated as FastAPI validates it (``from_attributes``, locations
   under ``body``), its errors written as the worker writes them
   (``worker.errors.validation_error_to_api_error``);
4. the first checks of the route's handler, those that read nothing but the request and the
   worker's configuration (``_first_checks``: the model name, then the API's own checks, which
   build the output constraint and refuse an oversized one).

``BodyScreen.refusal(ref, raw)`` (``ref``: the route's request model, ``worker.request_body.model_ref``)
returns the ``APIError`` the route would have answered, or None: the body passed (it is then parsed and checked again on the loop, as every body is),
the child is not running yet (the first large body starts it and goes the usual way), or it did not answer
within ``SCREEN_TIMEOUT_S``. So a screened request gets exactly the answer it would have got
unscreened (``tests/worker/test_body_screen.py`` compares them); only where the work happens
differs.

Child protocol (after ``"ready"``): a line ``<n> <module>:<qualname>`` then ``n`` bytes of body;
the answer is a line ``null`` or ``{"status", "message", "param", "code", "type"}``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import json
import sys
from typing import Any

from worker.child_process import ChildFailed, LineChild
from worker.errors import APIError, model_not_found
from worker.limits import RequestLimits
from worker.request_body import parse_counted

SCREEN_TIMEOUT_S = 10.0      # past this the child is restarted and the body goes the usual way


def _first_checks(ref: str):
    """``check(req, cfg)``: the handler's checks before any that reads the engine (each handler runs them
    first, in this order: ``worker.api.<api>.serving``); ``cfg``: the child's configuration."""
    from worker.api.chat.protocol import validate_chat
    from worker.api.completions.protocol import validate_completion

    def model(req, cfg) -> None:
        if req.model is not None and req.model not in cfg["model_names"]:
            raise model_not_found(req.model)

    def completion(req, cfg) -> None:
        model(req, cfg)
        validate_completion(req, cfg["max_logprobs"], cfg["limits"])

    def chat(req, cfg) -> None:
        model(req, cfg)
        validate_chat(req, cfg["max_logprobs"], cfg["limits"])

    return {"worker.api.completions.protocol:CompletionRequest": completion,
            "worker.api.chat.protocol:ChatCompletionRequest": chat,
            "worker.api.responses.protocol:ResponsesRequest": model}.get(ref)


class BodyScreen:
    """The worker's screen child (see the module docstring); it starts on the first body it applies to."""

    def __init__(self, config) -> None:
        limits = config.limits
        self.min_bytes = limits.screen_body_bytes
        cfg = {"limits": dataclasses.asdict(limits), "model_names": list(config.model_names),
               "max_logprobs": config.max_logprobs}
        self._child = LineChild([sys.executable, "-m", "worker.body_screen", json.dumps(cfg)], "body screen")
        self._one = asyncio.Lock()
        self.screened = 0       # bodies the child answered
        self.refused = 0        # of which it refused

    def applies(self, nbytes: int) -> bool:
        return bool(self.min_bytes) and nbytes >= self.min_bytes

    async def refusal(self, ref: str, raw: bytes) -> APIError | None:
        """The route's answer to ``raw`` if it refuses it by the checks above; None to go on as usual."""
        if not self._child.running:
            self._child.start_soon()            # not yet (or restarting): this body goes the usual way
            return None
        async with self._one:
            if not self._child.running:
                return None
            try:
                line = await self._child.ask(b"%d %s\n" % (len(raw), ref.encode()) + raw, SCREEN_TIMEOUT_S)
            except ChildFailed:
                return None
        self.screened += 1
        answer = json.loads(line)
        if answer is None:
            return None
        self.refused += 1
        return APIError(answer["status"], answer["message"], param=answer["param"], code=answer["code"],
                        type=answer["type"])

    def close(self) -> None:
        if self._child.starting is not None:
            self._child.starting.cancel()
        self._child.kill()


def screen(ref: str, raw: bytes, cfg: dict) -> APIError | None:
    """What the child does with one body: the route's refusal by the checks above, or None. ``cfg``:
    ``limits`` (a ``RequestLimits``), ``model_names``, ``max_logprobs`` (the worker's)."""
    from fastapi.exceptions import RequestValidationError
    from pydantic import ValidationError

    from worker.errors import validation_error_to_api_error

    try:
        body = parse_counted(raw, cfg["limits"])
    except APIError as exc:
        return exc
    if not isinstance(body, dict):              # bad JSON (None) or not an object: the route's own answer
        return None
    try:
        req = _adapter(ref).validate_python(body, from_attributes=True)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        return validation_error_to_api_error(RequestValidationError(errors))
    check = _first_checks(ref)
    try:
        if check is not None:
            check(req, cfg)
    except APIError as exc:
        return exc
    return None


_ADAPTERS: dict[str, Any] = {}


def _adapter(ref: str):
    if ref not in _ADAPTERS:
        from pydantic import TypeAdapter

        module, name = ref.split(":")
        obj = importlib.import_module(module)
        for part in name.split("."):
            obj = getattr(obj, part)
        _ADAPTERS[ref] = TypeAdapter(obj)
    return _ADAPTERS[ref]


def _serve(cfg_json: str) -> None:
    from swiftcommon.priority import background_priority

    background_priority()
    cfg = json.loads(cfg_json)
    cfg["limits"] = RequestLimits(**cfg["limits"])
    inp, out = sys.stdin.buffer, sys.stdout
    out.write('"ready"\n')
    out.flush()
    while True:
        header = inp.readline()
        if not header:
            return
        n, ref = header.split(b" ", 1)
        raw = inp.read(int(n))
        err = screen(ref.decode().strip(), raw, cfg)
        answer = None if err is None else {"status": err.status, "message": err.message, "param": err.param,
                                           "code": err.code, "type": err.type}
        out.write(json.dumps(answer) + "\n")
        out.flush()


if __name__ == "__main__":
    _serve(sys.argv[1])
