"""Tool-call formats of model families: a small registry, as vLLM's ``--tool-call-parser``.

A ``ToolFormat`` knows one family's way of writing tool calls:

- ``extract(text) -> (content, calls)``: the calls a finished output makes (``tool_choice``
  "auto"), each ``(name, arguments as a JSON string)``, when the output opens with a call;
  text that is not a well-formed call stays content, so a model that answers in prose
  loses nothing.
- ``render_calls(calls) -> str``: an assistant message's ``tool_calls`` written the way the
  model writes them, for chat templates that do not render ``tool_calls`` themselves.
- ``system_prompt(tools) -> str``: the tools described in the family's own words, for chat
  templates that do not render ``tools`` (SmolLM2-135M-Instruct's does not).
- ``may_start_call(text)``: while streaming, whether the text so far could still become a
  call (the edge then holds it back instead of streaming it as content).

Formats: ``smollm2`` (SmolLM2-Instruct's ``<tool_call>[{"name": ..., "arguments": {...}}]
</tool_call>``, first) and ``llama3_json`` (Llama 3.x: a JSON object ``{"name": ...,
"parameters": {...}}``, several separated by ``;``, optionally after ``<|python_tag|>``).
``for_template`` picks one from a chat template's text.
"""

from __future__ import annotations

import json
from typing import Callable

Call = tuple[str, str]          # (function name, arguments: a JSON object as a string)


def _dumps(obj) -> str:
    return json.dumps(obj, ensure_ascii=False)


def _call_of(obj, args_key: str) -> Call | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get(args_key, obj.get("arguments", obj.get("parameters", {})))
    if isinstance(args, str):           # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return obj["name"], _dumps(args)


def _tool_lines(tools: list[dict]) -> str:
    return "\n".join(_dumps(t.get("function", t)) for t in tools)


class ToolFormat:
    name = ""
    start = ""                         # text that opens a call

    def extract(self, text: str) -> tuple[str | None, list[Call]]:
        raise NotImplementedError

    def render_calls(self, calls: list[Call]) -> str:
        raise NotImplementedError

    def system_prompt(self, tools: list[dict]) -> str:
        raise NotImplementedError

    def may_start_call(self, text: str) -> bool:
        t = text.lstrip()
        return t.startswith(self.start) or self.start.startswith(t)


class SmolLM2Format(ToolFormat):
    name = "smollm2"
    start = "<tool_call>"
    end = "</tool_call>"

    def extract(self, text):
        i = text.find(self.start)
        if i < 0 or text[:i].strip():          # a call opens the output (the stream decides on its start too)
            return text, []
        j = text.find(self.end, i)
        body = text[i + len(self.start):j if j >= 0 else len(text)].strip()
        try:
            parsed = json.loads(body)
        except json.JSONDecodeError:
            return text, []
        items = parsed if isinstance(parsed, list) else [parsed]
        calls = [_call_of(o, "arguments") for o in items]
        if not calls or any(c is None for c in calls):
            return text, []
        rest = (text[:i] + (text[j + len(self.end):] if j >= 0 else "")).strip()
        return rest or None, calls

    def render_calls(self, calls):
        return self.start + _dumps([{"name": n, "arguments": json.loads(a)} for n, a in calls]) + self.end

    def system_prompt(self, tools):
        return ("You are an expert in composing functions. You are given a question and a set of possible "
                "functions. Based on the question, you will need to make one or more function/tool calls to "
                "achieve the purpose. If none of the functions can be used, answer in plain text.\n\n"
                "You have access to the following tools:\n<tools>" + _tool_lines(tools) + "</tools>\n\n"
                "The output MUST strictly adhere to the following format, and NO other text MUST be included.\n"
                "<tool_call>[\n{\"name\": \"func_name1\", \"arguments\": {\"argument1\": \"value1\"}},\n"
                "... (more tool calls as required)\n]</tool_call>")


class Llama3JsonFormat(ToolFormat):
    name = "llama3_json"
    start = "{"
    tag = "<|python_tag|>"

    def extract(self, text):
        body = text.strip()
        if body.startswith(self.tag):
            body = body[len(self.tag):].strip()
        if not body.startswith("{"):
            return text, []
        calls, dec, pos = [], json.JSONDecoder(), 0
        while pos < len(body):
            try:
                obj, end = dec.raw_decode(body, pos)
            except json.JSONDecodeError:
                return text, []
            call = _call_of(obj, "parameters")
            if call is None:
                return text, []
            calls.append(call)
            pos = end
            while pos < len(body) and body[pos] in " \n\t;":
                pos += 1
        return None, calls

    def render_calls(self, calls):
        return "; ".join(_dumps({"name": n, "parameters": json.loads(a)}) for n, a in calls)

    def system_prompt(self, tools):
        return ("When you receive a tool call response, use the output to format an answer to the original user "
                "question.\n\nGiven the following functions, please respond with a JSON for a function call with "
                "its proper arguments that best answers the given prompt.\n\nRespond in the format "
                '{"name": function name, "parameters": dictionary of argument name and its value}. '
                "Do not use variables.\n\n" + _tool_lines(tools))

    def may_start_call(self, text):
        t = text.lstrip()
        return t.startswith(("{", self.tag)) or self.tag.startswith(t)


FORMATS: dict[str, Callable[[], ToolFormat]] = {"smollm2": SmolLM2Format, "llama3_json": Llama3JsonFormat}


def for_template(template: str | None) -> ToolFormat:
    """The format a chat template's family uses: Llama 3's templates mention ``<|python_tag|>`` or the
    ``ipython`` role; anything else gets SmolLM2's (the default model's)."""
    t = template or ""
    if "<|python_tag|>" in t or "ipython" in t:
        return Llama3JsonFormat()
    return SmolLM2Format()
