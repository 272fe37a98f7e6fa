"""The Responses API's request (``POST /v1/responses``), validated under its own field names.

``ResponsesRequest`` declares the Responses API's fields; every one either takes effect or is
refused with a 400 naming it, in its own terms (``input.<i>...``, ``text.format...``,
``tools.<i>.parameters``, ``max_output_tokens``): nothing becomes a chat request and no error
is renamed afterwards. ``validate`` refuses what this stateless server cannot do;
``check_generation`` checks the generation fields and builds the output constraint of
``text.format`` once (``text``, ``json_object``, or ``json_schema`` with ``name``, ``schema``,
``strict``, flat as the Responses API has it: ``worker.structured.json_schema_spec``);
``sampling()`` is what it asks of the engine (``worker.api.sampling.to_sampling_params``). The
input items and tools are read by ``worker.api.responses.items``; the output models are
``worker.api.responses.models``.

SwiftServe's migration fields ``return_token_ids`` and ``continuation_token_ids``
(``worker.continuation``) are streams-only here: a continuation needs ``stream: true``.

Refused: ``store: true`` and ``previous_response_id`` (nothing is stored: an absent
``store`` is taken as false and reported as such), tools other than functions (web and
file search, computer use, MCP: nothing here runs them), ``max_tool_calls``, reasoning,
background mode, ``truncation: "auto"``, ``include`` and ``top_logprobs`` (no logprobs in
this API yet), reusable prompts and conversations.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from refengine.structured.spec import StructuredSpec
from swiftcommon.token_limits import requested_limit
from worker.api.base_request import INT64_MAX, INT64_MIN, BaseRequest
from worker.api.sampling import Constraint, Sampling
from worker.continuation import check_continuation
from worker.errors import bad_request
from worker.limits import RequestLimits
from worker.structured import ANY_OBJECT, check_size, json_schema_spec

FORMAT = "text.format"          # the field of the output constraint


class ResponsesRequest(BaseRequest):
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)   # vLLM extension
    stream: bool | None = False
    text: dict[str, Any] | None = None
    metadata: dict[str, str] | None = None           # returned with the response, as OpenAI does
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None              # prefix caching is automatic here; accepted
    service_tier: str | None = None
    parallel_tool_calls: bool | None = None
    tool_choice: str | dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    # Migration (worker.continuation), streams only: token ids in ``swiftserve.token_ids`` events, and a
    # generation resumed after ids generated elsewhere.
    return_token_ids: bool | None = None
    continuation_token_ids: list[int] | None = None
    # Declared so that they are refused rather than silently ignored:
    store: bool | None = None
    previous_response_id: str | None = None
    reasoning: dict[str, Any] | None = None
    background: bool | None = None
    truncation: Literal["auto", "disabled"] | None = None
    include: list[str] | None = None
    top_logprobs: int | None = None
    prompt: dict[str, Any] | None = None
    conversation: str | dict[str, Any] | None = None
    max_tool_calls: int | None = None

    def text_format(self) -> dict:
        fmt = (self.text or {}).get("format") or {"type": "text"}
        return fmt if isinstance(fmt, dict) else {"type": fmt}

    def requested_max_tokens(self) -> int | None:
        return requested_limit("responses", {"max_output_tokens": self.max_output_tokens})

    def sampling(self) -> Sampling:
        return Sampling("input", "max_output_tokens", self.requested_max_tokens(), self.temperature, self.top_p,
                        seed=self.seed, continuation=tuple(self.continuation_token_ids or ()))


def validate(req: ResponsesRequest) -> None:
    """Refuse (400) what this stateless server cannot do; needs no tokenizer."""
    if req.store:
        raise bad_request("store: true is not supported: this server keeps no responses. Send store: false "
                          "(or leave it out) and pass the conversation in input.", "store")
    if req.previous_response_id is not None:
        raise bad_request("previous_response_id is not supported: this server keeps no responses. Pass the "
                          "earlier turns in input instead.", "previous_response_id")
    fmt = req.text_format()
    if fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise bad_request(f"text.format type {fmt.get('type')!r} is not supported (text, json_object, json_schema).",
                          FORMAT)
    extra = set(req.text or {}) - {"format", "verbosity"}
    if extra or (req.text or {}).get("verbosity") not in (None, "medium"):
        raise bad_request("text supports only format (and verbosity 'medium').", "text")
    for i, t in enumerate(req.tools or []):
        if not isinstance(t, dict) or t.get("type") != "function":
            kind = t.get("type") if isinstance(t, dict) else None
            raise bad_request(f"Tools of type {kind!r} are not supported: only function tools (the client runs "
                              "them).", f"tools.{i}")
    for name, ok in (("reasoning", req.reasoning is None), ("background", not req.background),
                     ("truncation", req.truncation in (None, "disabled")), ("include", not req.include),
                     ("top_logprobs", not req.top_logprobs), ("prompt", req.prompt is None),
                     ("conversation", req.conversation is None), ("max_tool_calls", req.max_tool_calls is None)):
        if not ok:
            raise bad_request(f"{name} is not supported by this server's Responses API.", name)
    if not req.tools and req.tool_choice not in (None, "none", "auto"):
        raise bad_request("tool_choice requires tools.", "tool_choice")
    if req.continuation_token_ids is not None and not req.stream:
        raise bad_request("continuation_token_ids on /v1/responses needs stream: true.", "continuation_token_ids")


def check_generation(req: ResponsesRequest, limits: RequestLimits) -> Constraint | None:
    """The continuation (``worker.continuation``) and the output constraint of ``text.format``, built here once
    (400 naming ``text.format...`` when malformed or too large; nothing is compiled here)."""
    check_continuation(req)
    fmt = req.text_format()
    if fmt["type"] == "text":
        return None
    try:
        spec = StructuredSpec("json", ANY_OBJECT) if fmt["type"] == "json_object" else json_schema_spec(fmt, FORMAT)
    except RecursionError:
        raise bad_request("The output constraint is nested too deeply.", FORMAT) from None
    return FORMAT, check_size(spec, FORMAT, limits)


def echo_format(req: ResponsesRequest) -> dict:
    """``text`` as the Response object reports it."""
    return {"format": req.text_format()}
