"""A request's choices: one *choice* is one engine request, its events made by ``run_choice``.

``run_choice`` turns its ``RequestOutput`` stream into ``ChoiceEvent``s: a continuation's
replayed text first (``replayed``: not output, formatters only update their state with it), text
deltas (``OutputText``: incremental detokenisation + stop strings), logprobs, prompt logprobs
(first event), and exactly one final event carrying ``finish_reason``. A ``score_only`` choice
(echo with ``max_tokens: 0``) reports no generated text or token and ``finish_reason="length"``.
On a stop-string hit it closes the engine stream and aborts the engine request, reporting
``finish_reason="stop"`` and ``stop_reason=<the string>``. The engine's EOS / stop token is not
part of the text unless ``include_stop_str_in_output`` (as vLLM).

``ChoiceStreams`` runs each choice in its own asyncio task and merges the events.
Cancelling it (client disconnect, error) cancels every task synchronously; each
task's ``finally`` aborts its engine request. Keeping engine consumption in
separate tasks means cleanup never depends on awaits inside a cancelled scope.
The HTTP side of a request (admission, streaming or not, disconnects) is ``worker.api.driver``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import AsyncIterator

from refengine.outputs import TokenLogprob
from refengine.sampling_params import SamplingParams
from worker.continuation import DRAIN_ABORT
from worker.detokenizer import OutputText
from worker.metrics import RequestTracker
from worker.serving import ServingState


@dataclass
class ChoiceEvent:
    index: int
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    prompt_logprobs: list[TokenLogprob | None] | None = None     # on the choice's first event, when asked
    token_ids: list[int] = field(default_factory=list)           # generated ids of this event (EOS included)
    replayed: bool = False      # a continuation's text as the first worker's edge had it: state, not output


@dataclass
class ChoiceSpec:
    index: int
    engine_request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    skip_special_tokens: bool = True
    score_only: bool = False        # echo with max_tokens 0: the engine's one sampled token is dropped
    continuation: list[int] = field(default_factory=list)   # already generated elsewhere (worker.continuation)
    text_min_tokens: int | None = None      # the request's min_tokens, counted from the first generated token
    report_ids: bool = False        # return_token_ids: every token is reported, with text or not


def engine_prompt(spec: ChoiceSpec) -> list[int]:
    return spec.prompt_token_ids + spec.continuation if spec.continuation else spec.prompt_token_ids


async def run_choice(state: ServingState, spec: ChoiceSpec, tracker: RequestTracker) -> AsyncIterator[ChoiceEvent]:
    engine, params = state.engine, spec.params
    min_tokens = params.min_tokens if spec.text_min_tokens is None else spec.text_min_tokens
    text = OutputText(state.tokenizer, spec.prompt_token_ids, params.stop, params.include_stop_str_in_output,
                      min_tokens, spec.skip_special_tokens)
    # Replay the continuation unreported: the detokenizer and the stop matcher reach the state the first
    # worker was in (what it withheld, a split character or a possible stop prefix, comes out here).
    replayed = text.add_tokens(spec.continuation).text
    n_done = len(spec.continuation)
    gen = engine.generate(spec.engine_request_id, engine_prompt(spec), params)
    done = False
    n_prompt = len(spec.prompt_token_ids)
    state.active.add(spec.engine_request_id)
    try:
        if n_done:              # the formatter's own state (chat's tool-call holding) replays it too
            yield ChoiceEvent(spec.index, replayed, num_prompt_tokens=n_prompt, num_output_tokens=n_done,
                              replayed=True)
        async for out in gen:
            tracker.on_output(out)
            ids = out.new_token_ids
            ended_by_token = out.finished and out.finish_reason == "stop" and ids
            text_ids = ids[:-1] if ended_by_token and not params.include_stop_str_in_output else ids
            delta = text.add_tokens(text_ids)
            # usage counts the whole generation: the continuation is output, not prompt
            ev = ChoiceEvent(spec.index, delta.text, list(out.new_logprobs or []),
                             num_prompt_tokens=n_prompt if n_done else (out.num_prompt_tokens or n_prompt),
                             num_output_tokens=out.num_output_tokens + n_done, prompt_logprobs=out.prompt_logprobs,
                             token_ids=list(ids))
            if spec.score_only:         # max_tokens 0: nothing generated is reported (its one token ends it)
                ev.text, ev.logprobs, ev.num_output_tokens, ev.token_ids = "", [], 0, []
            if delta.stop_string is not None and not out.finished:
                done = True
                # Free the engine first, then report: the stop string is the finish.
                await gen.aclose()
                await engine.abort(spec.engine_request_id)
                tracker.on_finish("stop", out.timings)
                ev.finish_reason, ev.stop_reason = "stop", delta.stop_string
                yield ev
                return
            if out.finished:
                done = True
                if spec.score_only:
                    ev.finish_reason = "length"
                elif delta.stop_string is not None:
                    ev.finish_reason, ev.stop_reason = "stop", delta.stop_string
                elif out.finish_reason == "abort" and state.drain_aborting:
                    # Migratable (worker.continuation): the withheld tail stays withheld, as the worker
                    # that resumes replays these tokens and sends it then.
                    ev.finish_reason, ev.stop_reason = "abort", DRAIN_ABORT
                else:
                    ev.text += text.finish().text
                    ev.finish_reason = out.finish_reason or "stop"
                    ev.stop_reason = out.stop_reason
                tracker.on_finish(ev.finish_reason, out.timings)
                yield ev
                return
            # A token without text (a skipped special token, a withheld byte) still counts when ids are reported.
            if ev.text or ev.logprobs or ev.prompt_logprobs or (spec.report_ids and ev.token_ids):
                yield ev
        # The contract says a stream ends with a finished increment; treat anything else as an abort.
        done = True
        tracker.on_finish("abort")
        draining = state.drain_aborting
        yield ChoiceEvent(spec.index, "" if draining else text.finish().text, finish_reason="abort",
                          stop_reason=DRAIN_ABORT if draining else None,
                          num_prompt_tokens=n_prompt, num_output_tokens=text.num_tokens)
    finally:
        state.active.discard(spec.engine_request_id)
        if not done:
            tracker.on_finish("abort")
            await gen.aclose()
            await engine.abort(spec.engine_request_id)


class ChoiceStreams:
    """Merge several choices' event streams; each runs in its own task."""

    _END = object()

    def __init__(self, state: ServingState, specs: list[ChoiceSpec], arrival: float) -> None:
        self.queue: asyncio.Queue = asyncio.Queue()
        self.remaining = len(specs)
        self.tasks = [asyncio.create_task(self._drain(state, s, state.metrics.tracker(arrival))) for s in specs]

    async def _drain(self, state: ServingState, spec: ChoiceSpec, tracker: RequestTracker) -> None:
        it = run_choice(state, spec, tracker)
        try:
            async for ev in it:
                self.queue.put_nowait(ev)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which decides the status
            self.queue.put_nowait(exc)
        finally:
            await it.aclose()
            self.queue.put_nowait(self._END)

    async def events(self) -> AsyncIterator[ChoiceEvent]:
        try:
            while self.remaining:
                item = await self.queue.get()
                if item is self._END:
                    self.remaining -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield item
        finally:
            self.cancel()

    def cancel(self) -> None:
        for t in self.tasks:
            if not t.done():
                t.cancel()
