"""The Responses API's request model and its one translation into a chat request.

``POST /v1/responses`` is served without server-side state: every field this module
declares either takes effect or is refused with a 400 naming it (``validate``).
``input`` is text or a list of message items (``{"role", "content"}`` with an optional
``"type": "message"``; content as text or ``input_text`` / ``output_text`` parts);
``instructions`` becomes a leading system message; ``developer`` messages are system
messages. ``to_chat`` turns the request into a ``ChatCompletionRequest`` (rendered with
the model's chat template), from which ``to_sampling_params`` makes the engine's
parameters once, exactly as for /v1/chat/completions.

Refused: ``store: true`` and ``previous_response_id`` (nothing is stored: an absent
``store`` is taken as false and reported as such), ``text.format`` other than
``{"type": "text"}`` (JSON output needs structured outputs, not built yet), tools,
reasoning, background mode, ``truncation: "auto"``, ``include`` and
``top_logprobs`` (no logprobs in this API yet), reusable prompts and conversations.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from worker.errors import bad_request
from worker.protocol import INT64_MAX, INT64_MIN, ChatCompletionRequest, _Request

ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
TEXT_PARTS = {"input_text", "output_text", "text"}


class ResponsesRequest(_Request):
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
    parallel_tool_calls: bool | None = None          # meaningless without tools: accepted
    tool_choice: str | dict[str, Any] | None = None
    # Declared so that they are refused rather than silently ignored:
    store: bool | None = None
    previous_response_id: str | None = None
    tools: list[dict[str, Any]] | None = None
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


def validate(req: ResponsesRequest) -> None:
    """Refuse (400) what this stateless server cannot do; needs no tokenizer."""
    if req.store:
        raise bad_request("store: true is not supported: this server keeps no responses. Send store: false "
                          "(or leave it out) and pass the conversation in input.", "store")
    if req.previous_response_id is not None:
        raise bad_request("previous_response_id is not supported: this server keeps no responses. Pass the "
                          "earlier turns in input instead.", "previous_response_id")
    fmt = req.text_format()
    if fmt.get("type") != "text":
        raise bad_request(f"text.format of type {fmt.get('type')!r} is not supported: JSON output needs "
                          "structured outputs, which this server does not have yet. Use {'type': 'text'}.",
                          "text.format")
    extra = set(req.text or {}) - {"format", "verbosity"}
    if extra or (req.text or {}).get("verbosity") not in (None, "medium"):
        raise bad_request("text supports only format {'type': 'text'} (and verbosity 'medium').", "text")
    if req.tools:
        raise bad_request("tools (function calling) are not supported.", "tools")
    if req.tool_choice not in (None, "none", "auto"):
        raise bad_request("tool_choice requires tools, which are not supported.", "tool_choice")
    for name, ok in (("reasoning", req.reasoning is None), ("background", not req.background),
                     ("truncation", req.truncation in (None, "disabled")), ("include", not req.include),
                     ("top_logprobs", not req.top_logprobs), ("prompt", req.prompt is None),
                     ("conversation", req.conversation is None), ("max_tool_calls", req.max_tool_calls is None)):
        if not ok:
            raise bad_request(f"{name} is not supported by this server's Responses API.", name)


def _content(value: Any, where: str) -> str:
    if value is None or isinstance(value, str):
        return value or ""
    if not isinstance(value, list):
        raise bad_request("content must be text or a list of text parts.", where)
    texts = []
    for j, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(kind, str) or kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
            raise bad_request(f"Content part {kind!r} is not supported (text parts only).", f"{where}.{j}")
        texts.append(part["text"])
    return "\n".join(texts)


def messages(req: ResponsesRequest) -> list[dict[str, str]]:
    """``instructions`` + ``input`` -> chat messages."""
    out = [{"role": "system", "content": req.instructions}] if req.instructions is not None else []
    if isinstance(req.input, str):
        return out + [{"role": "user", "content": req.input}]
    if not req.input:
        raise bad_request("input must not be empty.", "input")
    for i, item in enumerate(req.input):
        if item.get("type", "message") != "message":       # function calls, reasoning, references
            raise bad_request(f"Input items of type {item.get('type')!r} are not supported (messages only).",
                              f"input.{i}")
        role = ROLES.get(item["role"]) if isinstance(item.get("role"), str) else None
        if role is None:
            raise bad_request(f"Input message role must be one of {sorted(ROLES)}.", f"input.{i}.role")
        out.append({"role": role, "content": _content(item.get("content"), f"input.{i}.content")})
    return out


def to_chat(req: ResponsesRequest) -> ChatCompletionRequest:
    return ChatCompletionRequest(messages=messages(req), model=req.model, max_completion_tokens=req.max_output_tokens,
                                 temperature=req.temperature, top_p=req.top_p, seed=req.seed, user=req.user)
