"""One driver for every generation endpoint: admission, the engine run, streaming or not.

``serve`` is the part of ``/v1/completions``, ``/v1/chat/completions`` and ``/v1/responses``
that does not depend on the endpoint: take an admission slot, ``prepare`` the request
(tokenise, build the ``ChoiceSpec``s and the endpoint's ``Formatter``), then either
stream (``GuardedStreamingResponse``: the slot is released when the body closes) or run
the whole generation under ``until_disconnect`` (499 when the client goes away). A
failure before the response is handed over releases the slot here.

The driver owns the engine loop (``ChoiceStreams``) and its error mapping; the formatter
owns the wire format. Invariants the driver keeps for every formatter:
- streaming: ``opening`` and every ``stream_event`` run inside the error guard, so a
  failure after the first byte ends the stream with ``failed(err)`` (in-band, the status
  line is gone); the engine requests are cancelled and aborted in every case.
- non-streaming: every event goes to ``add`` in order; an exception from the engine run
  becomes an ``APIError`` (``engine_error``); ``result`` runs after the engine is done.

``ChoicesFormatter`` is the base of the chat and completions formatters (their shared
chunk envelope, usage and ``[DONE]``); ``seeded`` gives choice ``i`` its seed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from typing import Any, AsyncIterator, Awaitable, Callable, Iterable, Protocol

from fastapi import Request, Response
from starlette.responses import JSONResponse, StreamingResponse

from refengine.outputs import RequestFailed
from refengine.sampling_params import SamplingParams
from swiftcommon.faults import FAULT_HEADER, REQUEST_FAULT
from worker.api.choice_models import UsageInfo, now
from worker.api.sampling import child_seed
from worker.choices import ChoiceEvent, ChoiceSpec, ChoiceStreams
from worker.errors import APIError
from worker.serving import ServingState

log = logging.getLogger(__name__)

SSE_DONE = "data: [DONE]\n\n"


def sse(payload: str) -> str:
    return f"data: {payload}\n\n"


def sse_json(obj: dict) -> str:
    """One SSE ``data:`` event holding ``obj`` as compact JSON (non-ASCII kept as is)."""
    return sse(json.dumps(obj, ensure_ascii=False, separators=(",", ":")))


def engine_error(exc: BaseException) -> APIError:
    """Map an exception from the engine stream to an API error. A request that failed alone in the
    engine is the request's fault, never the worker's: a constraint it could not follow is a 400; any
    other failure a 500 marked as the request's (``swiftcommon.faults``: a gateway neither retries it
    nor counts it against the worker)."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, ValueError):
        return APIError(400, str(exc))
    if isinstance(exc, RequestFailed):
        if exc.constraint:
            return APIError(400, str(exc), code="constraint_failed")
        return APIError(500, f"Internal error while generating: {exc}", code="engine_request_failed",
                        headers={FAULT_HEADER: REQUEST_FAULT})
    log.error("engine error: %r", exc, exc_info=exc)
    return APIError(503, f"The engine failed: {exc}", code="engine_error")


class Formatter(Protocol):
    """The per-endpoint half of a generation request: what goes on the wire."""

    def opening(self) -> Iterable[str]:
        """Stream: what is sent before the first engine event."""

    def stream_event(self, ev: ChoiceEvent) -> Iterable[str]:
        """Stream: what one engine event sends (possibly nothing)."""

    def closing(self) -> Iterable[str]:
        """Stream: what is sent after the last engine event (usage, terminal events)."""

    def failed(self, err: APIError) -> Iterable[str]:
        """Stream: how a failure after the first byte ends the stream."""

    def add(self, ev: ChoiceEvent) -> None:
        """Non-streaming: fold one engine event into the answer."""

    def result(self) -> Any:
        """Non-streaming: the answer (a response model, or a Response)."""


async def serve(state: ServingState, raw: Request, stream: bool,
                prepare: Callable[[], Awaitable[tuple[list[ChoiceSpec], Formatter]]],
                headers: dict[str, str] | None = None) -> Response:
    """Run one generation request whose cheap checks have passed. ``prepare`` runs after
    admission (tokenisation, sampling parameters); it may raise ``APIError``."""
    arrival = time.monotonic()
    state.admit()
    handed_over = False
    try:
        specs, fmt = await prepare()
        if stream:
            body = _stream(state, specs, arrival, fmt)
            handed_over = True
            return GuardedStreamingResponse(body, on_close=state.release, headers=headers)
        try:
            return with_headers(await until_disconnect(raw, _full(state, specs, arrival, fmt)), headers)
        except ClientDisconnected:
            return Response(status_code=499)
    finally:
        if not handed_over:
            state.release()


HEAVY_PROMPT_LOGPROBS = 256     # an event with more prompt logprob entries is formatted off the event loop


def _heavy(ev: ChoiceEvent) -> bool:
    return ev.prompt_logprobs is not None and len(ev.prompt_logprobs) > HEAVY_PROMPT_LOGPROBS


async def _full(state: ServingState, specs: list[ChoiceSpec], arrival: float, fmt: Formatter) -> Any:
    events = ChoiceStreams(state, specs, arrival).events()
    try:
        async for ev in events:
            if _heavy(ev):          # a long prompt's logprobs: formatting takes long (the loop waits, unblocked)
                await asyncio.to_thread(fmt.add, ev)
            else:
                fmt.add(ev)
    except Exception as exc:  # noqa: BLE001 - mapped to an OpenAI error
        raise engine_error(exc) from exc
    finally:
        await events.aclose()
    return fmt.result()


async def _stream(state: ServingState, specs: list[ChoiceSpec], arrival: float, fmt: Formatter) -> AsyncIterator[str]:
    streams = ChoiceStreams(state, specs, arrival)
    events = streams.events()
    try:
        for piece in fmt.opening():
            yield piece
        async for ev in events:
            pieces = await asyncio.to_thread(lambda: list(fmt.stream_event(ev))) if _heavy(ev) else \
                fmt.stream_event(ev)
            for piece in pieces:
                yield piece
        for piece in fmt.closing():
            yield piece
    except Exception as exc:  # noqa: BLE001 - the status line is gone: report in-band, as vLLM does
        for piece in fmt.failed(engine_error(exc)):
            yield piece
    finally:
        streams.cancel()
        await events.aclose()


async def _wait_disconnect(receive) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return


class ClientDisconnected(Exception):
    pass


async def until_disconnect(raw_request, coro):
    """Run ``coro`` (a non-streaming generation); cancel it if the client goes away."""
    task = asyncio.ensure_future(coro)
    watcher = asyncio.ensure_future(_wait_disconnect(raw_request.receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        raise ClientDisconnected()
    return task.result()


class GuardedStreamingResponse(StreamingResponse):
    """A StreamingResponse that always closes its body iterator and runs ``on_close``.

    Starlette may stop iterating (client gone) while the generator sits at a
    ``yield``; closing it here runs the generator's ``finally`` (engine aborts) and
    ``on_close`` frees the admission slot even if the body never started."""

    def __init__(self, content, on_close: Callable[[], None], **kw) -> None:
        super().__init__(content, media_type="text/event-stream", **kw)
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                await self.body_iterator.aclose()
            finally:
                self._on_close()


def with_headers(model, headers: dict[str, str] | None):
    """A response model as is, or as JSON with ``headers`` (FastAPI then skips its own serialisation)."""
    if not headers:
        return model
    return JSONResponse(model.model_dump(mode="json"), headers=headers)


class ChoicesFormatter:
    """What chat and completions share on the wire: the chunk envelope, usage, ``[DONE]``.

    A subclass names its chunk ``object`` and ``content_key`` ("delta" or "text") and writes
    ``event_chunks`` (stream) and ``fold`` / ``result`` (whole answer). ``out_tokens`` holds
    each choice's generated-token count so far (the engine's, continuation included);
    ``prompt_tokens`` counts each prompt once; a choice's continuous usage counts its own
    prompt (``prompt_len``)."""

    object_name = ""
    content_key = ""

    def __init__(self, state: ServingState, req, request_id: str, specs: list[ChoiceSpec],
                 prompt_tokens: int) -> None:
        self.state, self.req, self.request_id = state, req, request_id
        self.created, self.model = now(), state.config.model_name
        self.prompt_tokens = prompt_tokens
        self.prompt_len = {s.index: len(s.prompt_token_ids) for s in specs}
        self.out_tokens = {s.index: 0 for s in specs}

    # ---- the driver's calls -------------------------------------------------------------------
    def opening(self) -> Iterable[str]:
        return ()

    def stream_event(self, ev: ChoiceEvent) -> Iterable[str]:
        if ev.replayed:
            self.replay(ev)
            return ()
        self.out_tokens[ev.index] = ev.num_output_tokens
        return self.event_chunks(ev)

    def closing(self) -> Iterable[str]:
        if self.req.include_usage:
            yield sse_json({"id": self.request_id, "object": self.object_name, "created": self.created,
                            "model": self.model, "choices": [], "usage": self.usage().model_dump()})
        yield SSE_DONE

    def failed(self, err: APIError) -> Iterable[str]:
        yield sse_json(err.body())
        yield SSE_DONE

    def add(self, ev: ChoiceEvent) -> None:
        if ev.replayed:
            self.replay(ev)
            return
        self.out_tokens[ev.index] = ev.num_output_tokens
        self.fold(ev)

    # ---- for subclasses -----------------------------------------------------------------------
    def replay(self, ev: ChoiceEvent) -> None:
        """A continuation's text, as the first worker's formatter saw it: rebuild state, send nothing."""

    def event_chunks(self, ev: ChoiceEvent) -> Iterable[str]:
        raise NotImplementedError

    def fold(self, ev: ChoiceEvent) -> None:
        raise NotImplementedError

    def chunk(self, index: int, content, logprobs=None, finish=None, stop=None, token_ids=None) -> str:
        """One choice's SSE chunk; ``content`` is the chat delta or the completion text."""
        obj = {"id": self.request_id, "object": self.object_name, "created": self.created, "model": self.model,
               "choices": [{"index": index, self.content_key: content, "logprobs": logprobs,
                            "finish_reason": finish, "stop_reason": stop}]}
        if self.req.return_token_ids:
            obj["choices"][0]["token_ids"] = token_ids or []
        if self.req.continuous_usage:
            p, n = self.prompt_len[index], self.out_tokens[index]
            obj["usage"] = {"prompt_tokens": p, "completion_tokens": n, "total_tokens": p + n}
        elif self.req.include_usage:
            obj["usage"] = None
        return sse_json(obj)

    def usage(self) -> UsageInfo:
        n = sum(self.out_tokens.values())
        return UsageInfo(prompt_tokens=self.prompt_tokens, completion_tokens=n, total_tokens=self.prompt_tokens + n)


def seeded(base: SamplingParams, i: int) -> SamplingParams:
    """Choice ``i``'s parameters: choice 0 keeps the request's seed, the others derive theirs."""
    return dataclasses.replace(base, seed=child_seed(base.seed, i)) if i else base
