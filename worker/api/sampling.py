"""Sampling: the fields completions and chat share, their checks, and the one conversion of any
API's request to the engine's ``SamplingParams``.

Requests ignore unknown fields (``worker.api.base_request``), but every field declared here
either takes effect or is refused with a 400 naming it (``validate_sampling``, then each API's
own checks in ``worker.api.<api>.protocol``). Ranges are pydantic ``Field`` bounds, so a wrong
type or an out-of-range value becomes a 400 through the app's validation handler. Fields that
need the tokenised prompt (context length, default ``max_tokens``, token id ranges) are checked
in ``to_sampling_params``, called once per prompt by the preparation step (``worker.api.prepare``).

Every API's request model says what it asks of the engine through ``sampling()``: a
``Sampling``, the request's settings in the engine's terms before the prompt is known, with the
names that API gives the prompt and the output limit (an error about the context names them).
``validate_sampling`` builds the request's output constraint (``worker.structured``) exactly
once and returns it; nothing else builds it again.

Defaults follow vLLM: completions ``max_tokens`` defaults to 16 and an explicit ``null`` means
"the rest of the context"; chat defaults to the rest of the context. Which field limits the
output (chat: ``max_completion_tokens`` before ``max_tokens``) is the one rule of
``swiftcommon.token_limits``, which the gateway's estimate reads too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

from pydantic import Field, model_validator

from refengine.sampling_params import SamplingParams
from refengine.structured.spec import StructuredSpec
from worker.api.base_request import INT64_MAX, INT64_MIN, BaseRequest
from worker.continuation import check_continuation
from worker.errors import bad_request
from worker.limits import RequestLimits, check_count
from worker.request_fields import pop_unimplemented
from worker.structured import request_constraint

Constraint = tuple[str, StructuredSpec]        # (the field that asked for it, the spec)


@dataclass(frozen=True)
class Sampling:
    """A request's generation settings in the engine's terms, before its prompt is known. ``prompt_param``
    and ``max_tokens_param`` are the request's own names for its prompt and its output limit."""
    prompt_param: str
    max_tokens_param: str
    requested_max_tokens: int | None = None       # None: the rest of the context; 0: score the prompt only
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    logit_bias: dict[str, float] | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None            # the engine's top-k for prompt tokens
    prompt_logprob_ranks: bool = False            # vLLM's prompt_logprobs shape reports ranks; echo does not
    speculative: bool | None = None
    continuation: tuple[int, ...] = ()


class StreamOptions(BaseRequest):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False     # vLLM extension: usage in every chunk


class SamplingRequest(BaseRequest):
    """The fields /v1/completions and /v1/chat/completions share. A subclass names its prompt field
    (``prompt_param``) and says how it asks for logprobs and the output limit."""
    model: str | None = None                        # None: the served model (vLLM allows omitting it)
    n: int = Field(1, ge=1, le=128)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)          # vLLM extension; -1 or 0 disables
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(None, gt=0.0)
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    truncate_prompt_tokens: int | None = Field(None, ge=1)   # keep only the last k prompt tokens
    user: str | None = None                          # accepted for compatibility; identifies the caller only
    logit_bias: dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = None   # token id -> bias
    prompt_logprobs: int | None = Field(None, ge=0)  # vLLM extension; upper bound: WorkerConfig.max_logprobs
    # vLLM fields we have not built, set to something other than "off" (worker.request_fields): refused.
    vllm_unimplemented: list[str] = Field(default_factory=list, exclude=True)
    _chat: ClassVar[bool] = False
    prompt_param: ClassVar[str] = "prompt"
    # Structured outputs (worker.structured): at most one of response_format, structured_outputs, guided_*.
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: Any = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_whitespace_pattern: str | None = None
    # Migration (worker.continuation): vLLM's ``return_token_ids`` puts the generated ids on each
    # choice / chunk; ``continuation_token_ids`` (SwiftServe) resumes a generation after these ids.
    return_token_ids: bool | None = False
    continuation_token_ids: list[int] | None = None
    # Speculative decoding (SwiftServe; vLLM has no request field for it): true / false asks for / opts out of
    # drafting on a worker started with --speculative-config (ServingState.check_speculative); null: its default.
    speculative: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _unimplemented(cls, data: Any) -> Any:
        data, given = pop_unimplemented(data, cls._chat)
        if isinstance(data, dict):
            data["vllm_unimplemented"] = given
        return data

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.continuous_usage_stats)

    def sampling(self) -> Sampling:
        return Sampling(
            self.prompt_param, "max_tokens", self.requested_max_tokens(), self.temperature, self.top_p, self.top_k,
            self.min_p, self.seed, self.presence_penalty, self.frequency_penalty, self.repetition_penalty,
            tuple(self.stop_list()), tuple(self.stop_token_ids or ()), self.include_stop_str_in_output,
            self.ignore_eos, self.min_tokens, self.logit_bias, self.logprobs_k(), self.engine_prompt_logprobs(),
            self.prompt_logprobs is not None, self.speculative, tuple(self.continuation_token_ids or ()))


def validate_sampling(req: SamplingRequest, max_logprobs: int = 20,
                      limits: RequestLimits | None = None) -> Constraint | None:
    """Refuse (400) values of the shared fields we accept syntactically but do not support, and what is
    over the cheap limits (``worker.limits``: stop strings, the constraint's size). Needs no tokenizer.
    Returns the request's output constraint (``worker.structured.request_constraint``), built here once."""
    limits = limits or RequestLimits()
    if req.stream_options is not None and not req.stream:
        raise bad_request("stream_options can only be set when stream is true.", "stream_options")
    for key in req.logit_bias or {}:
        if not (key.isascii() and key.isdigit() and len(key) <= 12):      # int() takes no "²", no 5000 digits
            raise bad_request(f"logit_bias keys must be token ids (non-negative integers), got {key!r}.", "logit_bias")
    if req.prompt_logprobs is not None:
        if req.prompt_logprobs > max_logprobs:
            raise bad_request(f"prompt_logprobs must be <= {max_logprobs}.", "prompt_logprobs")
        if req.stream:
            raise bad_request("prompt_logprobs are not available when stream is true (use echo with logprobs "
                              "on /v1/completions).", "prompt_logprobs")
    check_continuation(req)
    if req.vllm_unimplemented:
        name = req.vllm_unimplemented[0]
        raise bad_request(f"{name} (a vLLM request field) is not supported by this server; remove it or leave it "
                          "at its default.", name)
    constraint = request_constraint(req, limits)
    if constraint is not None:
        # The grammar decides where the output ends (its mask then allows only EOS).
        if req.ignore_eos:
            raise bad_request("ignore_eos cannot be combined with structured outputs: the constraint ends the "
                              "output.", "ignore_eos")
        if req.min_tokens:
            raise bad_request("min_tokens cannot be combined with structured outputs: the constraint decides "
                              "where the output ends.", "min_tokens")
    stops = req.stop_list()
    check_count(len(stops), limits.max_stop_strings, "stop strings", "--max-stop-strings", "stop")
    if any(s == "" for s in stops):
        raise bad_request("stop strings must not be empty.", "stop")
    if req.stop_token_ids and any(t < 0 for t in req.stop_token_ids):
        raise bad_request("stop_token_ids must be non-negative token ids.", "stop_token_ids")
    mt = req.requested_max_tokens()
    if mt is not None and req.min_tokens > mt:
        raise bad_request(f"min_tokens ({req.min_tokens}) must be <= max_tokens ({mt}).", "min_tokens")
    return constraint


def to_sampling_params(req, *, prompt_len: int, max_model_len: int, vocab_size: int, done: int = 0,
                       structured: StructuredSpec | None = None) -> SamplingParams:
    """The one conversion from any API's request (its ``sampling()``) to engine parameters, for one prompt;
    ``structured``: the request's constraint, built and compiled once by ``worker.api.prepare``.

    ``done``: continuation tokens already generated; ``prompt_len`` includes them (the engine's
    prompt is prompt + continuation), and ``max_tokens`` / ``min_tokens`` shrink by them.
    Raises a 400 naming the numbers when the prompt (plus ``max_tokens``) does not fit."""
    s = req.sampling()
    if prompt_len >= max_model_len:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, your prompt has "
            f"{prompt_len} tokens, which leaves no room for a completion. Please reduce the prompt length.",
            s.prompt_param)
    requested = s.requested_max_tokens
    if requested is not None and done:
        requested -= done               # > 0: check_continuation refused the rest
    if requested is None:
        max_tokens = max_model_len - prompt_len
    elif requested == 0:
        max_tokens = 1          # echo only: the engine needs to sample one token; the edge drops it
    else:
        if prompt_len + requested > max_model_len:
            raise bad_request(
                f"This model's maximum context length is {max_model_len} tokens. However, you requested "
                f"{prompt_len + requested} tokens ({prompt_len} in the prompt, {requested} in the completion). "
                "Please reduce the length of the prompt or completion.", s.max_tokens_param)
        max_tokens = requested
    stop_ids = s.stop_token_ids
    if any(t >= vocab_size for t in stop_ids):
        raise bad_request(f"stop_token_ids must be < the vocabulary size {vocab_size}.", "stop_token_ids")
    top_k = s.top_k if s.top_k is not None else 0
    bias = tuple(sorted((int(t), float(b)) for t, b in (s.logit_bias or {}).items()))
    if any(t >= vocab_size for t, _ in bias):
        raise bad_request(f"logit_bias token ids must be < the vocabulary size {vocab_size}.", "logit_bias")
    return SamplingParams(
        max_tokens=max_tokens,
        min_tokens=min(max(0, s.min_tokens - done), max_tokens),
        temperature=1.0 if s.temperature is None else s.temperature,
        top_p=1.0 if s.top_p is None else s.top_p,
        top_k=0 if top_k == -1 else top_k,
        min_p=s.min_p or 0.0,
        seed=s.seed,
        presence_penalty=s.presence_penalty or 0.0,
        frequency_penalty=s.frequency_penalty or 0.0,
        repetition_penalty=1.0 if s.repetition_penalty is None else s.repetition_penalty,
        stop_token_ids=stop_ids,
        ignore_eos=s.ignore_eos,
        logprobs=s.logprobs,
        prompt_logprobs=s.prompt_logprobs,
        prompt_logprob_ranks=s.prompt_logprob_ranks,
        logit_bias=bias,
        structured=structured,
        structured_prefix=s.continuation,
        speculative=s.speculative,
        stop=s.stop,
        include_stop_str_in_output=s.include_stop_str_in_output,
    )


def child_seed(seed: int | None, index: int) -> int | None:
    """Seed of choice ``index`` of an n>1 request: distinct per choice, reproducible, int64."""
    if seed is None:
        return None
    return ((seed + index - INT64_MIN) % 2**64) + INT64_MIN
