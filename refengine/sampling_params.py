"""Internal sampling parameters: the one small object the engine understands.

The HTTP edge validates a permissive pydantic request and converts it once into
this dataclass. Stop *strings* are carried here but applied at the edge (the
engine speaks token ids only); everything else is applied by the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from refengine.structured.spec import StructuredSpec


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    min_tokens: int = 0
    temperature: float = 1.0          # 0 => greedy
    top_p: float = 1.0                # 1 => disabled
    top_k: int = 0                    # 0 => disabled
    min_p: float = 0.0                # 0 => disabled
    seed: int | None = None           # per-request generator when set
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0   # 1 => disabled
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None       # None: no logprobs; k: chosen token + top-k alternatives
    # None: no prompt logprobs; k: each prompt token's logprob (+ rank) and the top-k alternatives,
    # computed in the prefill pass (the first prompt token has none).
    prompt_logprobs: int | None = None
    prompt_logprob_ranks: bool = False  # also each prompt token's rank (vLLM's prompt_logprobs shape shows it)
    logit_bias: tuple[tuple[int, float], ...] = ()   # (token id, added to its logit) before sampling
    structured: StructuredSpec | None = None          # the output must match it (token masks in the sampler)
    # A continuation's ids (generated elsewhere, now at the end of the prompt): the constraint consumes them
    # before this request's output, so its state is the one the first engine was in. Unused without one.
    structured_prefix: tuple[int, ...] = ()
    # Speculative decoding (refengine.spec): True drafts for this request, False never, None: the engine's
    # default (on when it was started with a speculative config).
    speculative: bool | None = None
    # Applied at the edge by the detokenizer, not by the engine:
    stop: tuple[str, ...] = field(default=())
    include_stop_str_in_output: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature <= 1e-5

    def __post_init__(self) -> None:
        # The edge has already produced user-facing 4xx errors; these guard internal callers.
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0 (0 disables)")
        if self.repetition_penalty <= 0:
            raise ValueError("repetition_penalty must be > 0")
        if self.prompt_logprobs is not None and self.prompt_logprobs < 0:
            raise ValueError("prompt_logprobs must be >= 0")
