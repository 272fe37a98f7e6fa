"""The gateway's edge: what a request body must be before it is routed.

``read_body`` enforces the size limit (``Content-Length`` first, then the bytes as
they arrive, so an oversized body is never held whole) and a deadline for the whole
body (a client trickling bytes gets a 408 instead of holding a connection forever).
``parse_body`` turns the bytes into a JSON object with the fields routing needs.
Each failure is an ``EdgeError`` that the app answers with an OpenAI-style 4xx; no
input reaches a 500. ``until_client_gone`` runs the forwarding of a request whose body has
been read and cancels it when the client disconnects (a non-streamed answer can take
minutes; cancelling closes the upstream request, which makes the worker abort its
generation instead of finishing it for nobody). The worker validates every field; the gateway checks only what
it must read itself: ``model`` (optional on /tokenize and /detokenize, as in vLLM) and the
input its path needs (``messages``, ``prompt``, ``input`` for /v1/responses, ``prompt`` or
``messages`` for /tokenize, ``tokens`` for /detokenize).
"""

from __future__ import annotations

import asyncio

from fastapi import Request
from starlette.requests import ClientDisconnect

from swiftcommon.json_body import parse_json


_timeout = getattr(asyncio, "timeout", None)


class EdgeError(Exception):
    def __init__(self, status: int, reason: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.reason, self.param = status, reason, param


async def read_body(request: Request, max_bytes: int, timeout: float) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.strip().isdigit():
            raise EdgeError(400, "bad_content_length", "The Content-Length header is not a number.")
        if int(declared) > max_bytes:
            raise EdgeError(413, "body_too_large", f"Request body exceeds {max_bytes} bytes.")

    async def collect() -> bytes:
        parts, size = [], 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > max_bytes:
                    raise EdgeError(413, "body_too_large", f"Request body exceeds {max_bytes} bytes.")
                parts.append(chunk)
        except ClientDisconnect:        # nobody to answer; no traceback either
            raise EdgeError(400, "client_disconnected", "The client went away while sending the body.") from None
        return b"".join(parts)

    try:
        if _timeout is not None:                # no extra task per request (Python >= 3.11)
            async with _timeout(timeout):
                return await collect()
        return await asyncio.wait_for(collect(), timeout)
    except asyncio.TimeoutError:
        raise EdgeError(408, "body_timeout", f"The request body did not arrive within {timeout:g} s.") from None


async def until_client_gone(request: Request, aw):
    """Await ``aw`` (the forwarding, after the body was read), cancelled if the client disconnects
    meanwhile: then a bare 499 (nobody reads it)."""
    from fastapi.responses import Response

    task = asyncio.ensure_future(aw)
    gone = asyncio.ensure_future(_disconnected(request.receive))
    try:
        await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return Response(status_code=499)
    return task.result()


async def _disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def parse_body(path: str, raw: bytes) -> dict:
    try:                                        # big ints as floats: the body is written again with orjson
        body = parse_json(raw, big_ints="float")
    except (ValueError, RecursionError):        # bad JSON, bad UTF-8, nesting too deep
        raise EdgeError(400, "bad_json", "We could not parse the JSON body of your request.") from None
    if not isinstance(body, dict):
        raise EdgeError(400, "bad_json", "The request body must be a JSON object.")
    tokenizer_path = path in ("/tokenize", "/detokenize")
    model = body.get("model")
    if (not tokenizer_path or model is not None) and (not isinstance(model, str) or not model):
        raise EdgeError(400, "invalid_request", "Missing or invalid required parameter: 'model'.", "model")
    if path.endswith("/chat/completions"):
        _require(isinstance(body.get("messages"), list) and body["messages"], "messages")
    elif path == "/v1/responses":
        _require(isinstance(body.get("input"), (str, list)) and body["input"] not in ("", []), "input")
    elif path == "/detokenize":
        _require(isinstance(body.get("tokens"), list), "tokens")
    elif path == "/tokenize":
        _require(body.get("prompt") is not None or body.get("messages") is not None, "prompt")
    elif body.get("prompt") in (None, "", []):
        _require(False, "prompt")
    return body


def _require(ok, param: str) -> None:
    if not ok:
        raise EdgeError(400, "invalid_request", f"Missing or invalid required parameter: '{param}'.", param)
