"""The stream kinds of ``swiftserve bench gateway failover --mix``: each kind's request, and what a client makes of its stream.

Kinds (stream ``i`` of a scenario is ``KINDS[i % 6]``): ``completions`` and ``chat``
(``ignore_eos``, ``max_tokens`` tokens), ``json_schema`` (chat with a small
``response_format`` schema), ``tools`` (chat, one function, ``tool_choice: "required"``),
``chat_n2`` (``n`` = 2, ``ignore_eos``) and ``responses`` (``/v1/responses``,
``max_output_tokens``). All greedy and streamed. The constrained kinds and ``responses``
cannot ignore EOS, so they may end before the cap: they are judged against the
uninterrupted run (same finish, same token count) instead of a fixed count.

``read(data)`` is what a client keeps of a stream (both SSE flavours: ``data: [DONE]`` and
the Responses API's terminal event): whether it ended, the first error it was told, whether
it kept one id (and, for Responses, one message item and sequence numbers 0, 1, 2, ...),
its output (per choice: content text and tool calls' names and arguments; for Responses the
output text and function calls), finishes and generated-token count. ``judge`` compares it
with ``read`` of the same request asked of a worker directly.
"""

from __future__ import annotations

import json

from gateway.streaming import RESPONSES_TERMINAL as TERMINAL    # the gateway's one list

KINDS = ("completions", "chat", "json_schema", "tools", "chat_n2", "responses")
OUTCOMES = ("complete", "wrong", "error", "lost")
STORY = {"type": "object", "additionalProperties": False, "required": ["title", "hero", "plot"],
         "properties": {"title": {"type": "string", "maxLength": 40}, "hero": {"type": "string", "maxLength": 24},
                        "plot": {"type": "string", "maxLength": 160}}}
BOOKS = {"type": "function", "function": {
    "name": "find_books", "description": "Find books about a topic",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["topic", "count"],
                   "properties": {"topic": {"type": "string", "maxLength": 40}, "count": {"type": "integer"}}}}}


def request(kind: str, topic: str, max_tokens: int) -> tuple[str, dict]:
    """(path, streamed greedy body) of one stream of ``kind`` about ``topic``."""
    common = {"model": "m", "temperature": 0, "stream": True}
    if kind == "completions":
        return "/v1/completions", {**common, "prompt": f"Write a long story about {topic}.", "max_tokens": max_tokens,
                                   "ignore_eos": True, "stream_options": {"include_usage": True}}
    if kind == "responses":
        return "/v1/responses", {**common, "input": f"Tell me everything about {topic}.",
                                 "max_output_tokens": max_tokens}
    prompt, extra = {
        "chat": (f"Write a long story about {topic}.", {"ignore_eos": True}),
        "chat_n2": (f"Write a poem about {topic}.", {"ignore_eos": True, "n": 2}),
        "json_schema": (f"Describe a story about {topic} as JSON.", {"response_format": {
            "type": "json_schema", "json_schema": {"name": "story", "schema": STORY}}}),
        "tools": (f"Find three books about {topic}.", {"tools": [BOOKS], "tool_choice": "required",
                                                       "parallel_tool_calls": False}),
    }[kind]
    return "/v1/chat/completions", {**common, "messages": [{"role": "user", "content": prompt}],
                                    "max_tokens": max_tokens, "stream_options": {"include_usage": True}, **extra}


def fixed_tokens(kind: str, max_tokens: int) -> int | None:
    """The completion tokens a stream of ``kind`` must report (None: whatever the uninterrupted run had)."""
    return {"completions": max_tokens, "chat": max_tokens, "chat_n2": 2 * max_tokens}.get(kind)


def events(data: bytes) -> list:
    """The ``data:`` payloads of an SSE body: parsed JSON, or the string ``[DONE]`` (a cut last event dropped)."""
    out = []
    for block in data.decode(errors="replace").split("\n\n"):
        payload = next((line[len("data: "):] for line in block.split("\n") if line.startswith("data: ")), None)
        if payload == "[DONE]":
            out.append(payload)
        elif payload is not None:
            try:
                out.append(json.loads(payload))
            except ValueError:
                break
    return out


def error_text(obj) -> str | None:
    """``code: message`` of an error event (the gateway's or a worker's) or a failed response, else None."""
    if not isinstance(obj, dict):
        return None
    err = obj.get("error")
    if not err and obj.get("type") == "response.failed":
        err = (obj.get("response") or {}).get("error") or {"code": "response.failed"}
    return f"{err.get('code')}: {str(err.get('message'))[:160]}" if err else None


def read(data: bytes) -> dict:
    """What a client keeps of a stream (see the module docstring)."""
    objs = events(data)
    responses = any(isinstance(o, dict) and str(o.get("type", "")).startswith("response.") for o in objs)
    error = next(filter(None, map(error_text, objs)), None)
    ended = bool(objs) and (objs[-1] == "[DONE]" or responses and objs[-1].get("type") in TERMINAL)
    seen = _responses(objs) if responses else _choices([o for o in objs if isinstance(o, dict) and "error" not in o])
    return {"ended": ended, "error": error, **seen}


def _choices(objs: list) -> dict:
    """Completions / chat chunks: per choice index the text, the tool calls, the roles and the finishes."""
    out: dict[int, dict] = {}
    for o in objs:
        for c in o.get("choices", []):
            ch = out.setdefault(c.get("index", 0), {"text": "", "calls": {}, "roles": 0, "finish": []})
            delta = c.get("delta") or {}
            ch["text"] += (c.get("text") or "") + (delta.get("content") or "")
            ch["roles"] += "role" in delta
            for tc in delta.get("tool_calls") or ():
                call = ch["calls"].setdefault(tc.get("index", 0), {"ids": set(), "name": "", "arguments": ""})
                call["ids"].update([tc["id"]] if "id" in tc else [])
                call["name"] += (tc.get("function") or {}).get("name") or ""
                call["arguments"] += (tc.get("function") or {}).get("arguments") or ""
            if c.get("finish_reason"):
                ch["finish"].append(c["finish_reason"])
    chat = any("delta" in c for o in objs for c in o.get("choices", []))
    one = (len({o.get("id") for o in objs}) == 1 and all(len(ch["finish"]) == 1 for ch in out.values())
           and all(len(call["ids"]) == 1 for ch in out.values() for call in ch["calls"].values())
           and (not chat or all(ch["roles"] == 1 for ch in out.values())))
    output = {i: [ch["text"], [[call["name"], call["arguments"]] for _, call in sorted(ch["calls"].items())]]
              for i, ch in sorted(out.items())}
    usage = next((o["usage"] for o in reversed(objs) if o.get("usage")), {})
    return {"one_id": one, "output": json.dumps(output), "finish": [ch["finish"] for _, ch in sorted(out.items())],
            "tokens": usage.get("completion_tokens")}


def _responses(objs: list) -> dict:
    """Responses events: one response id and message item, sequence numbers 0..n-1, the text and calls."""
    objs = [o for o in objs if isinstance(o, dict) and "type" in o]
    items = {o["item_id"] for o in objs if str(o.get("item_id", "")).startswith("msg")}
    one = (len({o["response"].get("id") for o in objs if "response" in o}) == 1 and len(items) <= 1
           and [o.get("sequence_number") for o in objs] == list(range(len(objs))))
    text = "".join(o.get("delta") or "" for o in objs if o["type"] == "response.output_text.delta")
    calls = [[o["item"].get("name"), o["item"].get("arguments")] for o in objs
             if o["type"] == "response.output_item.done" and (o.get("item") or {}).get("type") == "function_call"]
    final = (objs[-1].get("response") or {}) if objs else {}
    return {"one_id": one, "output": json.dumps([text, calls]), "finish": final.get("status"),
            "tokens": (final.get("usage") or {}).get("output_tokens")}


def judge_kind(kind: str, data: bytes, want: dict, max_tokens: int) -> str:
    """complete (correct), wrong (ended but not as the uninterrupted run ``want``), error, or lost."""
    got = read(data)
    if not got["ended"]:
        return "lost"
    if got["error"]:
        return "error"
    fixed = fixed_tokens(kind, max_tokens)
    same = all(got[k] == want[k] for k in ("output", "finish", "tokens"))
    ok = got["one_id"] and same and (fixed is None or got["tokens"] == fixed)
    return "complete" if ok else "wrong"
