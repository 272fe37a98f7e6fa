"""What a model answered, read from the bytes the client gets, and whether a constrained answer is valid.

``AnswerTap`` reads a completions or chat answer as it passes: a whole JSON body
(``feed_body``) or the SSE events of a stream (``feed``, any chunking); per choice
``index`` it keeps the text (completions ``text``, chat ``content``), the tool calls'
names and arguments, and the ``finish_reason``; an error event marks the answer broken.
Only requests the gateway inspects (a shadow sample or a constrained request) are tapped.

``constraint_of(path, body)`` names what the request constrained the output to, from the
fields the workers implement (``response_format`` json_object / json_schema, vLLM's
``structured_outputs`` and ``guided_json|regex|choice``, a ``tool_choice`` that forces a
call); ``valid(constraint, choice)`` checks the answer structurally: JSON that parses (and
matches the schema when ``jsonschema`` is installed), a full regex match, one of the
choices, or tool calls whose arguments are JSON objects. Grammars are not checked (None).
An answer cut by ``max_tokens`` (``finish_reason`` "length") is usually invalid: that is
what the rate shows when a variant rambles more than the original.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field


@dataclass
class Choice:
    text: list[str] = field(default_factory=list)
    calls: dict[int, dict] = field(default_factory=dict)     # tool-call index -> {"name", "arguments"}
    finish_reason: str | None = None

    @property
    def content(self) -> str:
        return "".join(self.text)


class AnswerTap:
    def __init__(self) -> None:
        self.choices: dict[int, Choice] = {}
        self.error = False
        self._pending = b""

    def feed(self, chunk: bytes) -> None:
        """Bytes of an SSE stream as the client gets them."""
        data = self._pending + chunk
        lf, crlf = data.rfind(b"\n\n"), data.rfind(b"\r\n\r\n")
        cut = max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)
        self._pending = data[cut:]
        for block in data[:cut].replace(b"\r\n", b"\n").split(b"\n\n"):
            for line in block.split(b"\n"):
                if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
                    self._event(line[5:].strip())

    def feed_body(self, body: bytes) -> None:
        """A whole (non-streamed) JSON answer."""
        self._event(body)

    def _event(self, payload: bytes) -> None:
        try:
            obj = json.loads(payload)
        except ValueError:
            self.error = True
            return
        if not isinstance(obj, dict):
            return
        if obj.get("error") is not None:
            self.error = True
        for c in obj.get("choices") or ():
            if not isinstance(c, dict):
                continue
            ch = self.choices.setdefault(c.get("index", 0), Choice())
            msg = c.get("delta") if isinstance(c.get("delta"), dict) else c.get("message")
            text = c.get("text") if "text" in c else (msg or {}).get("content")
            if isinstance(text, str):
                ch.text.append(text)
            for call in (msg or {}).get("tool_calls") or ():
                fn = call.get("function") or {}
                slot = ch.calls.setdefault(call.get("index", len(ch.calls)), {"name": "", "arguments": ""})
                slot["name"] += fn.get("name") or ""
                slot["arguments"] += fn.get("arguments") or ""
            if c.get("finish_reason") is not None:
                ch.finish_reason = c["finish_reason"]

    @property
    def finished(self) -> bool:
        return not self.error and bool(self.choices) and all(c.finish_reason for c in self.choices.values())


@dataclass(frozen=True)
class Constraint:
    kind: str            # json | regex | choice | tools
    spec: object = None  # the JSON schema, the pattern, the choices


def _schema(value):
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value if isinstance(value, dict) else None


def constraint_of(path: str, body: dict) -> Constraint | None:
    if path not in ("/v1/completions", "/v1/chat/completions"):
        return None
    rf = body.get("response_format")
    if isinstance(rf, dict):
        if rf.get("type") == "json_object":
            return Constraint("json")
        if rf.get("type") == "json_schema":
            return Constraint("json", _schema((rf.get("json_schema") or {}).get("schema")))
    so = body.get("structured_outputs") if isinstance(body.get("structured_outputs"), dict) else {}
    for key, kind in (("json", "json"), ("regex", "regex"), ("choice", "choice")):
        value = so.get(key, body.get(f"guided_{key}"))
        if value is None:
            continue
        if kind == "json":
            return Constraint("json", _schema(value) if value is not True else None)
        return Constraint(kind, value)
    if so.get("json_object") or body.get("guided_json_object"):
        return Constraint("json")
    tc = body.get("tool_choice")
    if body.get("tools") and (tc == "required" or isinstance(tc, dict)):
        return Constraint("tools")
    return None


def valid(c: Constraint, choice: Choice) -> bool | None:
    """True / False for a checked answer; None when this kind is not checked."""
    text = choice.content
    if c.kind == "tools":
        try:
            return bool(choice.calls) and all(isinstance(json.loads(x["arguments"] or "null"), dict)
                                              for x in choice.calls.values())
        except ValueError:
            return False
    if c.kind == "json":
        try:
            doc = json.loads(text)
        except ValueError:
            return False
        if c.spec is None:
            return isinstance(doc, dict)
        try:
            import jsonschema
        except ImportError:         # the gateway image may lack it: parsing is the check then
            return True
        try:
            jsonschema.validate(doc, c.spec)
        except jsonschema.ValidationError:
            return False
        except jsonschema.SchemaError:
            return None
        return True
    if c.kind == "regex":
        try:
            return re.fullmatch(c.spec, text) is not None if isinstance(c.spec, str) else None
        except re.error:            # a pattern Python's re does not read (the worker's engine may)
            return None
    if c.kind == "choice":
        return text in c.spec if isinstance(c.spec, list) else None
    return None
