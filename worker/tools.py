"""Tool calling on /v1/chat/completions and /v1/responses: ``tools``, ``tool_choice``,
``parallel_tool_calls``, tool history.

``plan(tools, choice, parallel, template, limits, function_of)`` checks the request's tools (400s
name the field: at most ``--max-tools``, each a function with a name and a ``parameters``
object, every schema and all of them together within ``--max-constraint-bytes``), each read in
its API's own shape by ``function_of`` so that the field named is that API's (chat's
``chat_function`` by default; the Responses API's flat tools: ``worker.api.responses.items``),
and returns a ``ToolPlan`` (None without tools, or with ``tool_choice: "none"``: then the tools
are not shown to the model and nothing is parsed). ``ToolPlan.checks`` lists the schemas to
compile before admission (``worker.constraints``: each tool's, then the constraint of
"required" or a named tool); nothing is compiled here:

- ``required``: the output is constrained (a grammar, as structured outputs) to a JSON
  array of ``{"name": <one of the tools>, "arguments": <that tool's parameters schema>}``,
  at least one, exactly one when ``parallel_tool_calls`` is false.
- a named function: constrained to that function's arguments object.
- ``auto``: unconstrained; the model's own format is parsed by the family's ``ToolFormat``
  (``worker.tool_parsers``); prose stays content.

History: an assistant message's ``tool_calls`` and ``role: "tool"`` results go to the chat
template as they are when the template renders them; for a template that does not
(SmolLM2-135M's renders only ``content``), the calls are written into the assistant's
content in the family's format and the tools are described in a system message, so the
model sees what it would have written. ``calls(plan, text)`` turns a finished output into
OpenAI ``tool_calls`` (ids ``call_<24 hex>``).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from refengine.structured.spec import StructuredSpec
from worker.errors import bad_request
from worker.limits import RequestLimits, check_count
from worker.structured import check_size
from worker.tool_parsers import Call, ToolFormat, for_template

FunctionOf = Callable[[int, Any], tuple[str, dict]]
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_EMPTY_PARAMS = {"type": "object", "properties": {}}


@dataclass
class ToolPlan:
    tools: list[dict]                  # OpenAI's {"type": "function", "function": {...}}, parameters filled in
    mode: str                          # "auto" | "required" | "named"
    named: str | None
    parallel: bool
    fmt: ToolFormat
    spec: StructuredSpec | None        # the constraint for required / named
    checks: list[tuple[str, StructuredSpec]]    # (field, schema) to compile before admission


def chat_function(i: int, t) -> tuple[str, dict]:
    """Tool ``i`` of a chat request (OpenAI's ``{"type": "function", "function": {...}}``) -> (the field of its
    function object, the function object)."""
    if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(t.get("function"), dict):
        raise bad_request("Each tool must be {'type': 'function', 'function': {...}}.", f"tools.{i}")
    return f"tools.{i}.function", t["function"]


def _check_tools(tools: list, limits: RequestLimits,
                 function_of: FunctionOf) -> tuple[list[dict], list[tuple[str, StructuredSpec]]]:
    """The tools with their parameters filled in, and each one's (field, schema spec)."""
    check_count(len(tools), limits.max_tools, "tools", "--max-tools", "tools")
    out, checks, total = [], [], 0
    for i, t in enumerate(tools):
        where = f"tools.{i}"
        field, fn = function_of(i, t)
        fn = dict(fn)
        if not isinstance(fn.get("name"), str) or not _NAME.match(fn["name"]):
            raise bad_request("A function name must be 1-64 letters, digits, '_', '.' or '-'.", f"{field}.name")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):         # [] or "" is no schema, not an empty one
            raise bad_request("function.parameters must be a JSON schema object.", f"{field}.parameters")
        params = params or _EMPTY_PARAMS
        try:
            spec = StructuredSpec("json", json.dumps(params, ensure_ascii=False, separators=(",", ":")))
        except (TypeError, ValueError, RecursionError):
            raise bad_request("function.parameters must be a JSON schema object.", f"{field}.parameters") \
                from None
        checks.append((f"{field}.parameters", check_size(spec, f"{field}.parameters", limits)))
        total += len(spec.text)
        if total > limits.max_constraint_bytes:
            raise bad_request(f"The tools' parameters schemas are {total}+ bytes together; this server takes at most "
                              f"{limits.max_constraint_bytes} (--max-constraint-bytes).", where)
        fn["parameters"] = params
        out.append({"type": "function", "function": fn})
    names = [t["function"]["name"] for t in out]
    if len(set(names)) != len(names):
        raise bad_request("Function names must be unique.", "tools")
    return out, checks


def _rebase(node, name: str):
    """A copy of a tool's schema node with its local references ("#...") rebased under ``#/$defs/<name>``
    (its own ``$defs`` / ``definitions`` become ``#/$defs/<name>.<def>``)."""
    if isinstance(node, list):
        return [_rebase(n, name) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _rebase(v, name) for k, v in node.items()}
    ref = out.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        for key in ("#/$defs/", "#/definitions/"):
            if ref.startswith(key):
                out["$ref"] = f"#/$defs/{name}." + ref[len(key):]
                break
        else:
            out["$ref"] = f"#/$defs/{name}" + ref[1:]
    return out


def _required_schema(tools: list[dict], parallel: bool) -> dict:
    """A JSON array of calls. Each tool's parameters schema moves under ``$defs`` (with its own
    ``$defs`` hoisted and its references rebased), so "#/..." references keep their targets."""
    defs, one = {}, []
    for t in tools:
        name = t["function"]["name"]
        params = dict(t["function"]["parameters"])
        local = {**params.pop("definitions", {}), **params.pop("$defs", {})}
        defs[name] = _rebase(params, name)
        defs.update({f"{name}.{k}": _rebase(v, name) for k, v in local.items()})
        one.append({"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                    "properties": {"name": {"const": name}, "arguments": {"$ref": f"#/$defs/{name}"}}})
    schema = {"$defs": defs, "type": "array", "minItems": 1, "items": one[0] if len(one) == 1 else {"anyOf": one}}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def plan(tools: list | None, choice, parallel_calls: bool | None, template: str | None,
         limits: RequestLimits | None = None, function_of: FunctionOf = chat_function) -> ToolPlan | None:
    """The request's tool plan. ``function_of(i, tool)`` reads tool ``i`` in the API's own shape (chat's by
    default); ``choice`` is in chat's form."""
    if not tools:
        if choice not in (None, "none", "auto"):
            raise bad_request("tool_choice needs tools.", "tool_choice")
        return None
    limits = limits or RequestLimits()
    tools, checks = _check_tools(tools, limits, function_of)
    if choice == "none":
        return None
    parallel = parallel_calls is not False
    fmt = for_template(template)
    if choice in (None, "auto"):
        return ToolPlan(tools, "auto", None, parallel, fmt, None, checks)
    if choice == "required":
        spec = StructuredSpec("json", json.dumps(_required_schema(tools, parallel)))
        check_size(spec, "tool_choice", limits)
        return ToolPlan(tools, "required", None, parallel, fmt, spec, checks + [("tool_choice", spec)])
    if isinstance(choice, dict) and choice.get("type", "function") == "function" \
            and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        match = [t for t in tools if t["function"]["name"] == name]
        if not match:
            raise bad_request(f"tool_choice names {name!r}, which is not in tools.", "tool_choice")
        spec = checks[tools.index(match[0])][1]           # the tool's own schema, compiled with the others
        return ToolPlan(tools, "named", name, False, fmt, spec, checks)
    raise bad_request("tool_choice must be 'none', 'auto', 'required' or {'type': 'function', 'function': "
                      "{'name': ...}}.", "tool_choice")


def prepare_messages(msgs: list[dict], p: ToolPlan | None, template: str | None) -> tuple[list[dict], list | None]:
    """Messages and the ``tools`` argument for the chat template (see the module docstring)."""
    t = template or ""
    fmt = p.fmt if p is not None else for_template(template)
    if "tool_calls" not in t:
        out = []
        for m in msgs:
            calls = m.get("tool_calls")
            if m.get("role") == "assistant" and calls:
                m = {k: v for k, v in m.items() if k != "tool_calls"}
                written = fmt.render_calls([(c["function"]["name"], c["function"].get("arguments") or "{}")
                                            for c in calls])
                m["content"] = ((m.get("content") or "") + "\n" + written).strip()
            out.append(m)
        msgs = out
    if p is None:
        return msgs, None
    if "tools" in t:
        return msgs, p.tools
    prompt = fmt.system_prompt(p.tools)
    if msgs and msgs[0].get("role") == "system":
        return [{**msgs[0], "content": prompt + "\n\n" + (msgs[0].get("content") or "")}] + msgs[1:], None
    return [{"role": "system", "content": prompt}] + msgs, None


def check_history(req) -> None:
    """An assistant's ``tool_calls`` in the history must be well-formed (their arguments: JSON objects)."""
    for i, m in enumerate(req.messages):
        calls = getattr(m, "tool_calls", None)
        if calls is None:
            continue
        for j, c in enumerate(calls if isinstance(calls, list) else [None]):
            fn = c.get("function") if isinstance(c, dict) else None
            ok = isinstance(fn, dict) and isinstance(fn.get("name"), str)
            if ok:
                try:
                    ok = isinstance(json.loads(fn.get("arguments") or "{}"), dict)
                except (TypeError, json.JSONDecodeError):
                    ok = False
            if not ok:
                raise bad_request("tool_calls entries need function.name and function.arguments (a JSON object "
                                  "as a string).", f"messages.{i}.tool_calls.{j}")


def calls(p: ToolPlan, text: str, finish: str | None = "stop") -> tuple[str | None, list[Call]]:
    """(content, calls) of an output under plan ``p`` that ended with ``finish``.

    Cut short (``finish`` "length"), a "required" array keeps the calls it completed (the
    model may keep appending calls while parallel calls are allowed); a cut named call or
    auto output has none, and its text is all there is."""
    if finish == "length":
        return (None, found) if p.mode == "required" and (found := _complete_calls(text)) else (text, [])
    if finish != "stop":
        return text, []
    if p.mode == "auto":
        return p.fmt.extract(text)
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        return text, []
    if p.mode == "named":
        return None, [(p.named, json.dumps(parsed, ensure_ascii=False))]
    return None, [(c["name"], json.dumps(c["arguments"], ensure_ascii=False)) for c in parsed]


def _complete_calls(text: str) -> list[Call]:
    """The whole ``{"name", "arguments"}`` elements at the start of a cut-off JSON array."""
    dec, out, i = json.JSONDecoder(), [], 0
    ws = re.compile(r"[\s,]*")
    i = ws.match(text, i).end()
    if not text.startswith("[", i):
        return []
    i += 1
    while True:
        i = ws.match(text, i).end()
        try:
            c, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return out
        if isinstance(c, dict) and isinstance(c.get("name"), str) and isinstance(c.get("arguments"), dict):
            out.append((c["name"], json.dumps(c["arguments"], ensure_ascii=False)))


def call_objects(found: list[Call]) -> list[dict]:
    return [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": {"name": n, "arguments": a}}
            for n, a in found]
