"""The one interface between the worker's HTTP layer and an engine backend.

Tokenisation happens at the edge: the HTTP layer owns the tokenizer, turns text
into token ids, and gives the engine ids and an internal ``SamplingParams``.
A backend runs its engine off the event loop (thread or process) and streams
``RequestOutput`` increments through ``generate``.

Contract:
- ``generate`` yields increments until one with ``finished=True``; it never
  yields after that. Cancelling the iterator (client disconnect) must abort the
  request inside the engine (backends do this in ``finally``).
- ``abort`` is idempotent and safe for unknown ids.
- ``stats`` is cheap and never blocks on the engine thread.
- ``max_model_len`` and ``eos_token_ids`` are valid once ``start`` has returned.

Optional attributes, read with ``getattr`` because not every backend has them:
``vocab_size`` (the model's vocabulary when it is smaller than the tokenizer's; the
reference engine reports it), ``prompt_logprobs_refusal`` (why prompt logprobs are
refused, or None; the vLLM backend with fast prefill) and ``constrained_continuation_refusal``
(why a continuation under a grammar is refused, or None: the engine honours
``SamplingParams.structured_prefix``; the vLLM backend refuses).

Backends satisfy this structurally (``refengine.async_engine.AsyncEngine``,
``refengine.engine_process.ProcessEngine``, ``worker.backends.vllm.VllmEngineClient``);
the worker annotates every place that holds the engine with it. Importing this module
loads no torch (``refengine.outputs`` and ``refengine.sampling_params`` are plain data).
"""

from __future__ import annotations

from typing import AsyncIterator, Protocol

from refengine.outputs import EngineStats, RequestOutput
from refengine.sampling_params import SamplingParams


class EngineClient(Protocol):
    """The engine the worker serves: ``app.state.engine`` and ``ServingState.engine``."""

    max_model_len: int
    eos_token_ids: tuple[int, ...]

    async def start(self) -> None: ...

    async def shutdown(self) -> None: ...

    def generate(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams
    ) -> AsyncIterator[RequestOutput]: ...

    async def abort(self, request_id: str) -> None: ...

    def stats(self) -> EngineStats: ...

    def healthy(self) -> bool: ...
