"""The OpenAI wire format: permissive request models, exact response models, and
the one conversion from a validated request to the engine's ``SamplingParams``.

Requests ignore unknown fields (the OpenAI SDK and vLLM clients send extras), but
every field declared here either takes effect or is refused with a 400 naming it
(``validate_request``). Ranges are pydantic ``Field`` bounds, so a wrong type or an
out-of-range value becomes a 400 through the app's validation handler. Fields
that need the tokenised prompt (context length, default ``max_tokens``, token id
ranges) are checked in ``to_sampling_params``, called once per request.

Defaults follow vLLM: completions ``max_tokens`` defaults to 16 and an explicit
``null`` means "the rest of the context"; chat defaults to the rest of the context.
Which field limits the output (chat: ``max_completion_tokens`` before ``max_tokens``) is
the one rule of ``swiftcommon.token_limits``, which the gateway's estimate reads too.
Scoring: completions ``echo`` with ``logprobs`` asks for the prompt tokens' logprobs
(engine ``prompt_logprobs = logprobs``), ``max_tokens: 0`` with ``echo`` scores without
generating (the engine samples one token that the edge drops, as vLLM), and
``prompt_logprobs`` (vLLM's field) returns them in vLLM's shape on both endpoints.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from refengine.sampling_params import SamplingParams
from swiftcommon.token_limits import DEFAULT_COMPLETION_TOKENS, requested_limit
from worker.errors import bad_request
from worker.request_fields import pop_unimplemented
from worker.continuation import check_continuation
from worker.limits import RequestLimits, check_count
from worker.structured import request_constraint, structured_spec

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _check_text(value: Any, where: str = "body") -> None:
    """JSON may escape lone UTF-16 surrogates ("\\ud800"); they are not text and would fail in
    the tokenizer and the chat template, so they are refused here, naming where. One C-speed
    encode of the whole body first (orjson's, which refuses any such string; where it refuses
    something else, such as an integer beyond 64 bits, the json module's): only a body that has
    one is walked (to name the place)."""
    try:
        orjson.dumps(value, default=str)
        return
    except TypeError:
        pass
    try:
        json.dumps(value, ensure_ascii=False, allow_nan=True, default=str).encode("utf-8")
        return
    except UnicodeEncodeError:
        pass
    except (TypeError, ValueError, RecursionError):
        pass                # not JSON-like (or nested too deeply to encode): walk it below
    _walk_text(value, where)


def _walk_text(value: Any, where: str) -> None:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{where} contains a lone surrogate escape, which is not valid Unicode text") from None
    elif isinstance(value, dict):
        for k, v in value.items():
            _walk_text(k, where)
            _walk_text(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _walk_text(v, f"{where}.{i}")


class _Request(BaseModel):
    # Unknown fields are accepted and ignored: clients send vendor extras. NaN and
    # infinities (which Python's JSON parser accepts) are refused for every number.
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _valid_text(cls, data: Any) -> Any:
        _check_text(data, "request")
        return data


class StreamOptions(_Request):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False     # vLLM extension: usage in every chunk


class _SamplingRequest(_Request):
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
    _constraint: Any = PrivateAttr(None)            # worker.structured.request_constraint's memo
    # Speculative decoding (SwiftServe; vLLM has no request field for it): true / false asks for / opts out of
    # drafting on a worker started with --speculative-config (worker.serving.check_speculative); null: its default.
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


class CompletionRequest(_SamplingRequest):
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


class ChatMessage(BaseModel):
    # Extra keys (name, tool_calls, tool_call_id, ...) are passed to the chat template.
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(_SamplingRequest):
    _chat: ClassVar[bool] = True
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)               # deprecated by OpenAI, still sent
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0)    # upper bound: WorkerConfig.max_logprobs
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_special_tokens: bool = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None                  # meaningless without tools: accepted
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None

    def requested_max_tokens(self) -> int | None:
        # The one rule (swiftcommon.token_limits): max_completion_tokens wins over max_tokens.
        return requested_limit("chat", {"max_completion_tokens": self.max_completion_tokens,
                                        "max_tokens": self.max_tokens})

    def logprobs_k(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def engine_prompt_logprobs(self) -> int | None:
        return self.prompt_logprobs


AnyRequest = CompletionRequest | ChatCompletionRequest


def validate_request(req: AnyRequest, max_logprobs: int = 20, limits: RequestLimits | None = None) -> None:
    """Refuse (400) values we accept syntactically but do not support, and what is over the cheap
    limits (``worker.limits``: stop strings, the constraint's size). Needs no tokenizer."""
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
    if request_constraint(req, limits) is not None:
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
    if isinstance(req, CompletionRequest):
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
    else:
        if req.top_logprobs and not req.logprobs:
            raise bad_request("top_logprobs requires logprobs to be true.", "top_logprobs")
        if req.top_logprobs is not None and req.top_logprobs > max_logprobs:
            raise bad_request(f"top_logprobs must be <= {max_logprobs}.", "top_logprobs")
        if req.functions or req.function_call not in (None, "none", "auto"):
            raise bad_request("functions (function calling) are not supported.", "functions")
        if req.add_generation_prompt and req.continue_final_message:
            raise bad_request("add_generation_prompt and continue_final_message cannot both be true.",
                              "continue_final_message")
        if req.continue_final_message and req.messages[-1].role != "assistant":
            raise bad_request("continue_final_message needs the last message to be from the assistant.",
                              "continue_final_message")


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


def to_sampling_params(req: AnyRequest, *, prompt_len: int, max_model_len: int, vocab_size: int,
                       done: int = 0) -> SamplingParams:
    """The one conversion from an API request to engine parameters, for one prompt.

    ``done``: continuation tokens already generated; ``prompt_len`` includes them (the engine's
    prompt is prompt + continuation), and ``max_tokens`` / ``min_tokens`` shrink by them.
    Raises a 400 naming the numbers when the prompt (plus ``max_tokens``) does not fit."""
    if prompt_len >= max_model_len:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, your prompt has "
            f"{prompt_len} tokens, which leaves no room for a completion. Please reduce the prompt length.",
            "messages" if isinstance(req, ChatCompletionRequest) else "prompt")
    requested = req.requested_max_tokens()
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
                "Please reduce the length of the prompt or completion.", "max_tokens")
        max_tokens = requested
    stop_ids = tuple(req.stop_token_ids or ())
    if any(t >= vocab_size for t in stop_ids):
        raise bad_request(f"stop_token_ids must be < the vocabulary size {vocab_size}.", "stop_token_ids")
    top_k = req.top_k if req.top_k is not None else 0
    bias = tuple(sorted((int(t), float(b)) for t, b in (req.logit_bias or {}).items()))
    if any(t >= vocab_size for t, _ in bias):
        raise bad_request(f"logit_bias token ids must be < the vocabulary size {vocab_size}.", "logit_bias")
    return SamplingParams(
        max_tokens=max_tokens,
        min_tokens=min(max(0, req.min_tokens - done), max_tokens),
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=0 if top_k == -1 else top_k,
        min_p=req.min_p or 0.0,
        seed=req.seed,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
        stop_token_ids=stop_ids,
        ignore_eos=req.ignore_eos,
        logprobs=req.logprobs_k(),
        prompt_logprobs=req.engine_prompt_logprobs(),
        prompt_logprob_ranks=req.prompt_logprobs is not None,      # vLLM's shape reports ranks; echo does not
        logit_bias=bias,
        structured=structured_spec(req),
        structured_prefix=tuple(req.continuation_token_ids or ()),
        speculative=req.speculative,
        stop=tuple(req.stop_list()),
        include_stop_str_in_output=req.include_stop_str_in_output,
    )


def child_seed(seed: int | None, index: int) -> int | None:
    """Seed of choice ``index`` of an n>1 request: distinct per choice, reproducible, int64."""
    if seed is None:
        return None
    return ((seed + index - INT64_MIN) % 2**64) + INT64_MIN
