"""A request's state inside the engine: token ids, progress, status. No torch.

``token_ids`` holds prompt + generated tokens in one list. The scheduler advances
``num_computed_tokens`` (positions whose KV has been computed) towards ``num_tokens``;
when a step computes the last known token, the model samples a new one.

Positions vs cache entries: an eviction KV method may drop computed tokens from the
cache (``num_evicted``). Then the cache holds ``num_cached_tokens =
num_computed_tokens - num_evicted`` entries per head, compacted to the front of the
block table, while RoPE positions keep counting ``num_computed_tokens``. Both reset
on preemption (the cache is rebuilt by recomputation).

Speculative decoding: a decoding request may carry drafted tokens (``spec_token_ids``) into a
step; the step computes their KV too, and the update keeps ``num_computed_tokens`` at the tokens
that were accepted (the cache entries past it are stale and overwritten later).
"""

from __future__ import annotations

import enum
import time

from refengine.outputs import RequestTimings
from refengine.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def finished(self) -> bool:
        return self not in (RequestStatus.WAITING, RequestStatus.RUNNING)


class Request:
    __slots__ = (
        "request_id", "token_ids", "num_prompt_tokens", "params", "eos_token_ids",
        "num_computed_tokens", "status", "stop_reason", "timings", "num_preemptions",
        "max_model_len", "forced_ids", "score_log", "num_evicted", "prefilled", "prompt_lps", "spec_token_ids",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        eos_token_ids: tuple[int, ...],
        max_model_len: int,
        arrival_time: float | None = None,
    ) -> None:
        if not prompt_token_ids:
            raise ValueError("prompt must contain at least one token")
        self.request_id = request_id
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.num_computed_tokens = 0
        self.num_evicted = 0            # computed tokens no longer in the cache (eviction)
        self.prefilled = False          # a token was sampled since the cache was (re)built
        self.status = RequestStatus.WAITING
        self.stop_reason: int | str | None = None
        self.timings = RequestTimings(arrival=arrival_time if arrival_time is not None else time.monotonic())
        self.num_preemptions = 0
        # Scoring (evaluation): the "sampled" tokens are these, and each step records
        # (logprob of the forced token, argmax token, full logprob row or None).
        self.forced_ids: list[int] | None = None
        self.score_log: list[tuple] = []
        # Prompt logprobs (params.prompt_logprobs): entry i is prompt token i's, filled from the
        # prefill rows as chunks compute them; entry 0 is None (no position predicts it).
        self.prompt_lps: list | None = [None] if params.prompt_logprobs is not None else None
        # Speculative decoding (refengine.spec): the tokens drafted for the next step, set by the drafter
        # before the scheduler runs and verified in that step; never part of ``token_ids``.
        self.spec_token_ids: list[int] = []

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_cached_tokens(self) -> int:
        """Entries per head in the cache (= positions computed, minus evicted ones)."""
        return self.num_computed_tokens - self.num_evicted

    @property
    def needs_prompt_scores(self) -> bool:
        """Prompt logprobs asked for and not all computed yet (the prefill must compute every
        position from scratch: no prefix-cache hits)."""
        return self.prompt_lps is not None and len(self.prompt_lps) < self.num_prompt_tokens

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
        self.check_stop(token_id)

    def check_stop(self, token_id: int) -> None:
        """Set a finished status if ``token_id`` (just appended) ends the request."""
        p = self.params
        n_out = self.num_output_tokens
        if n_out >= p.min_tokens:
            if not p.ignore_eos and token_id in self.eos_token_ids:
                self.status = RequestStatus.FINISHED_STOPPED
                return
            if token_id in p.stop_token_ids:
                self.status = RequestStatus.FINISHED_STOPPED
                self.stop_reason = token_id
                return
        if n_out >= p.max_tokens or self.num_tokens >= self.max_model_len:
            self.status = RequestStatus.FINISHED_LENGTH
