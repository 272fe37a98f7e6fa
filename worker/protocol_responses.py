"""The Responses API's request model and its one translation into a chat request.

``POST /v1/responses`` is served without server-side state: every field this module
declares either takes effect or is refused with a 400 naming it (``validate``).
``input`` is text or a list of message items (``{"role", "content"}`` with an optional
``"type": "message"``; content as text or ``input_text`` / ``output_text`` parts);
``instructions`` becomes a leading system message; ``developer`` messages are system
messages; ``function_call`` items become an assistant message's ``tool_calls`` (consecutive
ones in one message) and ``function_call_output`` items ``role: "tool"`` messages.
``to_chat`` turns the request into a ``ChatCompletionRequest`` (rendered with the model's
chat template), from which ``to_sampling_params`` makes the engine's parameters once,
exactly as for /v1/chat/completions:

- ``text.format``: ``text``, ``json_object`` or ``json_schema`` (``name``, ``schema``,
  ``strict``, flat as the Responses API has it) -> the chat ``response_format``.
- ``tools`` (function tools, flat: ``name``, ``description``, ``parameters``, ``strict``),
  ``tool_choice`` (``none``, ``auto``, ``required``, ``{"type": "function", "name"}``) and
  ``parallel_tool_calls`` -> the chat fields; the calls come back as ``function_call``
  output items (``worker.serving_responses``).

SwiftServe's migration fields ``return_token_ids`` and ``continuation_token_ids`` pass to the
chat request (``worker.continuation``); a continuation needs ``stream: true``.

Refused: ``store: true`` and ``previous_response_id`` (nothing is stored: an absent
``store`` is taken as false and reported as such), tools other than functions (web and
file search, computer use, MCP: nothing here runs them), ``max_tool_calls``, reasoning,
background mode, ``truncation: "auto"``, ``include`` and ``top_logprobs`` (no logprobs in
this API yet), reusable prompts and conversations.
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
                          "text.format")
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


def _function_call(item: dict, where: str) -> dict:
    args = item.get("arguments", "{}")
    if not isinstance(item.get("name"), str) or not isinstance(item.get("call_id"), str) or not isinstance(args, str):
        raise bad_request("A function_call item needs call_id, name and arguments (a JSON string).", where)
    return {"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": args}}


def _tool_output(item: dict, where: str) -> dict:
    out = item.get("output")
    if not isinstance(item.get("call_id"), str) or not isinstance(out, (str, list)):
        raise bad_request("A function_call_output item needs call_id and output.", where)
    return {"role": "tool", "tool_call_id": item["call_id"], "content": _content(out, f"{where}.output")}


def messages(req: ResponsesRequest) -> tuple[list[dict], list[list[str]]]:
    """``instructions`` + ``input`` -> (chat messages, where each came from: its Responses fields, one per
    tool call for an assistant message made of consecutive ``function_call`` items)."""
    out = [{"role": "system", "content": req.instructions}] if req.instructions is not None else []
    origins = [["instructions"]] if out else []
    if isinstance(req.input, str):
        return out + [{"role": "user", "content": req.input}], origins + [["input"]]
    if not req.input:
        raise bad_request("input must not be empty.", "input")
    for i, item in enumerate(req.input):
        kind, where = item.get("type", "message"), f"input.{i}"
        if kind == "function_call":
            call = _function_call(item, where)
            if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls") and not out[-1]["content"]:
                out[-1]["tool_calls"].append(call)
                origins[-1].append(where)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
                origins.append([where])
            continue
        origins.append([where])
        if kind == "function_call_output":
            out.append(_tool_output(item, where))
            continue
        if kind != "message":                               # reasoning, references, other tools' calls
            raise bad_request(f"Input items of type {kind!r} are not supported (messages, function_call, "
                              "function_call_output).", where)
        role = ROLES.get(item["role"]) if isinstance(item.get("role"), str) else None
        if role is None:
            raise bad_request(f"Input message role must be one of {sorted(ROLES)}.", f"{where}.role")
        out.append({"role": role, "content": _content(item.get("content"), f"{where}.content")})
    return out, origins


def input_param(param: str, origins: list[list[str]]) -> str:
    """A chat request's ``messages.<i>...`` field as the Responses field it came from (``input.<j>...``)."""
    head, _, rest = param.partition(".")
    if head != "messages":
        return param
    index, _, rest = rest.partition(".")
    if not index.isdigit() or int(index) >= len(origins):
        return "input"
    group = origins[int(index)]
    if rest.startswith("tool_calls.") and len(group) > 1:          # one function_call item per call
        k, _, rest = rest[len("tool_calls."):].partition(".")
        if k.isdigit() and int(k) < len(group):
            return group[int(k)] + ("." + rest.replace("function.", "", 1) if rest else "")
    if group[0] in ("instructions", "input"):
        return group[0]
    return group[0] + ("." + rest if rest else "")


def _response_format(fmt: dict) -> dict | None:
    if fmt["type"] != "json_schema":
        return None if fmt["type"] == "text" else {"type": fmt["type"]}
    js = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
    return {"type": "json_schema", "json_schema": js}


def _chat_tool(t: dict) -> dict:
    return {"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters", "strict")
                                             if k in t}}


def _tool_choice(choice):
    if isinstance(choice, dict) and choice.get("type") == "function" and "function" not in choice:
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def to_chat(req: ResponsesRequest) -> tuple[ChatCompletionRequest, list[list[str]]]:
    """The chat request, and where each of its messages came from (``input_param``)."""
    extra = {}
    if req.tools:
        extra = {"tools": [_chat_tool(t) for t in req.tools], "tool_choice": _tool_choice(req.tool_choice),
                 "parallel_tool_calls": req.parallel_tool_calls}
    elif req.tool_choice not in (None, "none", "auto"):
        raise bad_request("tool_choice requires tools.", "tool_choice")
    if req.continuation_token_ids is not None and not req.stream:
        raise bad_request("continuation_token_ids on /v1/responses needs stream: true.", "continuation_token_ids")
    msgs, origins = messages(req)
    return ChatCompletionRequest(messages=msgs, model=req.model, max_completion_tokens=req.max_output_tokens,
                                 temperature=req.temperature, top_p=req.top_p, seed=req.seed, user=req.user,
                                 response_format=_response_format(req.text_format()), stream=bool(req.stream),
                                 return_token_ids=req.return_token_ids,
                                 continuation_token_ids=req.continuation_token_ids, **extra), origins


def echo_format(req: ResponsesRequest) -> dict:
    """``text`` as the Response object reports it."""
    return {"format": req.text_format()}
