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
"""

from __future__ import annotations

from typing import AsyncIterator, Protocol

from refengine.outputs import EngineStats, RequestOutput
from refengine.sampling_params import SamplingParams


class EngineClient(Protocol):
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
