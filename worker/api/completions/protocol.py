"""The /v1/completions request: its fields (beyond ``worker.api.sampling``'s) and its checks.

Scoring: ``echo`` with ``logprobs`` asks for the prompt tokens' logprobs (engine
``prompt_logprobs = logprobs``), ``max_tokens: 0`` with ``echo`` scores without generating (the
engine samples one token that the edge drops, as vLLM), and ``prompt_logprobs`` (vLLM's field)
returns them in vLLM's shape. ``max_tokens`` defaults to 16 (``swiftcommon.token_limits``) and an
explicit ``null`` means "the rest of the context". The output models are
``worker.api.choice_models``.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from swiftcommon.token_limits import DEFAULT_COMPLETION_TOKENS, requested_limit
from worker.api.sampling import Constraint, SamplingRequest, validate_sampling
from worker.errors import bad_request
from worker.limits import RequestLimits


class CompletionRequest(SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(DEFAULT_COMPLETION_TOKENS, ge=0)   # 0 only with echo: score the prompt
    logprobs: int | None = Field(None, ge=0)        # upper bound: WorkerConfig.max_logprobs
    echo: bool | None = False
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1)
    add_special_tokens: bool = True

    def requested_max_tokens(self) -> int | None:
        return requested_limit("completions", {"max_tokens": self.max_tokens})

    def logprobs_k(self) -> int | None:
        return self.logprobs

    @property
    def score_only(self) -> bool:
        return bool(self.echo) and self.max_tokens == 0

    def engine_prompt_logprobs(self) -> int | None:
        """Top-k the engine computes for prompt tokens: enough for ``prompt_logprobs`` and for
        ``echo`` with ``logprobs`` (each formatter keeps its own k)."""
        ks = [self.prompt_logprobs, self.logprobs if self.echo else None]
        ks = [k for k in ks if k is not None]
        return max(ks) if ks else None


def validate_completion(req: CompletionRequest, max_logprobs: int = 20,
                        limits: RequestLimits | None = None) -> Constraint | None:
    """The shared checks (``validate_sampling``), then this API's; returns the output constraint."""
    constraint = validate_sampling(req, max_logprobs, limits)
    if req.best_of is not None and req.best_of != req.n:
        raise bad_request(f"best_of ({req.best_of}) != n ({req.n}) is not supported.", "best_of")
    if req.suffix is not None:
        raise bad_request("suffix is not supported.", "suffix")
    if req.max_tokens == 0 and not req.echo:
        raise bad_request("max_tokens 0 generates nothing: it is only allowed with echo (to score the "
                          "prompt).", "max_tokens")
    if req.logprobs is not None and req.logprobs > max_logprobs:
        raise bad_request(f"logprobs must be <= {max_logprobs}.", "logprobs")
    _check_prompt_shape(req.prompt)
    return constraint


def _check_prompt_shape(prompt: Any) -> None:
    if isinstance(prompt, str):
        if prompt == "":
            raise bad_request("The prompt must not be empty.", "prompt")
        return
    if len(prompt) == 0:
        raise bad_request("The prompt must not be empty.", "prompt")
    for p in prompt:
        if (isinstance(p, (str, list))) and len(p) == 0:
            raise bad_request("The prompt must not contain an empty prompt.", "prompt")
        if isinstance(p, int) and p < 0:
            raise bad_request("Prompt token ids must be non-negative.", "prompt")
        if isinstance(p, list) and any(t < 0 for t in p):
            raise bad_request("Prompt token ids must be non-negative.", "prompt")
