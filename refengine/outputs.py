"""What an engine streams back to the edge, and the load figures it reports.

These types are shared by every engine backend (reference and vLLM) so that the
worker's HTTP layer is written once. No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)  # (token_id, logprob), best first
    rank: int | None = None     # 1 + how many tokens were more likely (prompt logprobs report it)


@dataclass
class RequestTimings:
    """Monotonic timestamps (time.monotonic()) of a request's life inside the engine."""

    arrival: float
    first_scheduled: float | None = None
    first_token: float | None = None
    finished: float | None = None


@dataclass
class RequestOutput:
    """One increment of a request: the tokens produced since the previous increment.

    ``finish_reason`` is set on the last increment only: "stop" (EOS or a stop
    token), "length" (max_tokens or the context limit) or "abort".
    ``stop_reason`` is the stop token id that ended it, when there was one.
    """

    request_id: str
    new_token_ids: list[int]
    num_prompt_tokens: int
    num_output_tokens: int                      # cumulative, including new_token_ids
    new_logprobs: list[TokenLogprob] | None = None
    finished: bool = False
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    timings: RequestTimings | None = None       # filled on the final increment
    # On the first increment of a request that asked for them: one entry per prompt token,
    # the first None (nothing predicts it).
    prompt_logprobs: list[TokenLogprob | None] | None = None


@dataclass
class EngineStats:
    """A snapshot for /load and /metrics. Usage figures are in [0, 1]."""

    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0
    kv_blocks_total: int = 0
    kv_blocks_used: int = 0
    kv_block_size: int = 0
    kv_bytes_total: int = 0
    kv_bytes_per_token: float = 0.0             # bytes of KV the cache stores per token (all layers)
    kv_bytes_per_token_baseline: float = 0.0    # same model without KV methods, for the ratio
    num_preemptions: int = 0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    prefix_caching: bool = False
    prefix_cache_queries: int = 0               # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int = 0                  # of which found there
    extra: dict[str, float] = field(default_factory=dict)  # method-specific gauges
    # Speculative decoding (vLLM's spec_decode_* counters): None when the engine does not speculate.
    spec_decode: "SpecDecodeStats | None" = None


@dataclass
class SpecDecodeStats:
    """Running counts, as vLLM's ``vllm:spec_decode_*`` counters: verification steps with a draft, drafted
    tokens, accepted drafted tokens, and accepted tokens per draft position (index 0: the first drafted)."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)


class RequestFailed(RuntimeError):
    """One request failed inside an engine; the others go on. ``constraint``: its output constraint
    could not be followed (the client's input: the worker answers 400); else an engine error on
    this request alone (500, marked as the request's fault, never the engine's)."""

    def __init__(self, message: str, constraint: bool = False) -> None:
        super().__init__(message)
        self.constraint = constraint

    def __reduce__(self):                    # crosses the engine process's pipe with its flag
        return (RequestFailed, (str(self), self.constraint))
