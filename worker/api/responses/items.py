"""The Responses API's ``input`` items and tools, read in its own terms for the chat template.

``messages(req)``: ``instructions`` + ``input`` -> the chat template's messages. ``input`` is text
or a list of message items (``{"role", "content"}`` with an optional ``"type": "message"``;
content as text or ``input_text`` / ``output_text`` parts); ``instructions`` becomes a leading
system message; ``developer`` messages are system messages; ``function_call`` items become an
assistant message's ``tool_calls`` (consecutive ones in one message; their ``arguments`` must be
a JSON object as a string) and ``function_call_output`` items ``role: "tool"`` messages. Every
error names the item as the client sent it (``input.<i>``, ``input.<i>.content.<j>``).

Tools are flat function tools (``name``, ``description``, ``parameters``, ``strict``):
``function_of`` reads one for ``worker.tools.plan`` (errors name ``tools.<i>.name``,
``tools.<i>.parameters``); ``tool_choice`` (``none``, ``auto``, ``required``,
``{"type": "function", "name"}``) is given to the plan in its internal form (chat's).
"""

from __future__ import annotations

import json
from typing import Any

from worker.api.responses.protocol import ResponsesRequest
from worker.errors import bad_request

ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
TEXT_PARTS = {"input_text", "output_text", "text"}


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


def _json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except (TypeError, json.JSONDecodeError):
        return False


def _function_call(item: dict, where: str) -> dict:
    args = item.get("arguments", "{}")
    if not isinstance(item.get("name"), str) or not isinstance(item.get("call_id"), str) or not isinstance(args, str):
        raise bad_request("A function_call item needs call_id, name and arguments (a JSON string).", where)
    if not _json_object(args or "{}"):
        raise bad_request("A function_call item's arguments must be a JSON object (as a string).", where)
    return {"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": args}}


def _tool_output(item: dict, where: str) -> dict:
    out = item.get("output")
    if not isinstance(item.get("call_id"), str) or not isinstance(out, (str, list)):
        raise bad_request("A function_call_output item needs call_id and output.", where)
    return {"role": "tool", "tool_call_id": item["call_id"], "content": _content(out, f"{where}.output")}


def messages(req: ResponsesRequest) -> list[dict]:
    """``instructions`` + ``input`` -> the chat template's messages."""
    out = [{"role": "system", "content": req.instructions}] if req.instructions is not None else []
    if isinstance(req.input, str):
        return out + [{"role": "user", "content": req.input}]
    if not req.input:
        raise bad_request("input must not be empty.", "input")
    for i, item in enumerate(req.input):
        kind, where = item.get("type", "message"), f"input.{i}"
        if kind == "function_call":
            call = _function_call(item, where)
            if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls") and not out[-1]["content"]:
                out[-1]["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            out.append(_tool_output(item, where))
        elif kind != "message":                             # reasoning, references, other tools' calls
            raise bad_request(f"Input items of type {kind!r} are not supported (messages, function_call, "
                              "function_call_output).", where)
        else:
            role = ROLES.get(item["role"]) if isinstance(item.get("role"), str) else None
            if role is None:
                raise bad_request(f"Input message role must be one of {sorted(ROLES)}.", f"{where}.role")
            out.append({"role": role, "content": _content(item.get("content"), f"{where}.content")})
    return out


def function_of(i: int, t: dict) -> tuple[str, dict]:
    """Tool ``i`` (a function tool: ``validate`` refused the others) -> (its field, its function object)."""
    return f"tools.{i}", {k: t[k] for k in ("name", "description", "parameters", "strict") if k in t}


def tool_choice(req: ResponsesRequest):
    """``tool_choice`` in the plan's form: a named function as ``{"type": "function", "function": {"name"}}``."""
    choice = req.tool_choice
    if isinstance(choice, dict) and choice.get("type") == "function" and "function" not in choice:
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice
