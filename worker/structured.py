"""Structured-output request fields -> one ``StructuredSpec`` (or None), refused with a 400 when wrong.

Accepted, on /v1/completions and /v1/chat/completions (as vLLM 0.32):

- OpenAI's ``response_format``: ``{"type": "text"}`` (no constraint), ``{"type": "json_object"}``
  (any JSON object), ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}``.
  ``strict`` true or false, the schema is enforced in full (as vLLM does); a schema
  keyword the grammar library does not implement is a 400 naming it, never ignored.
- vLLM's ``structured_outputs``: exactly one of ``json`` (a schema, as an object or a JSON
  string), ``regex``, ``choice`` (a list of strings), ``grammar`` (GBNF or Lark),
  ``json_object``; options ``whitespace_pattern``, ``disable_any_whitespace`` (our JSON is
  compact by default, so it only confirms that), ``disable_additional_properties``
  (objects without ``additionalProperties`` get ``false``). ``structural_tag`` is refused.
- vLLM's older ``guided_json`` / ``guided_regex`` / ``guided_choice`` / ``guided_grammar``
  (+ ``guided_whitespace_pattern``).

At most one of the three families may be given. ``request_constraint`` builds the one
``StructuredSpec`` and refuses one larger than ``--max-constraint-bytes``; it compiles nothing.
The Responses API's ``text.format`` is built with the same ``json_schema_spec`` and ``check_size``
(``worker.api.responses.protocol``). The compile (against the model's tokenizer, with its
first token mask, in a child process with a time limit) is ``worker.constraints``, awaited once
per request by the preparation step (``worker.api.prepare``) before admission: a malformed regex
or grammar, an unsupported schema feature, a constraint that allows no output or that takes too
long are 400s naming the field.
"""

from __future__ import annotations

import json
from typing import Any

from refengine.structured.spec import StructuredSpec
from worker.errors import bad_request
from worker.limits import RequestLimits

_SO_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
_SO_OPTIONS = ("disable_any_whitespace", "disable_additional_properties", "whitespace_pattern")
ANY_OBJECT = '{"type":"object"}'


def _schema_text(value: Any, param: str) -> str:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise bad_request(f"{param} is not valid JSON: {exc}", param) from None
    if not isinstance(value, (dict, bool)):
        raise bad_request(f"{param} must be a JSON schema (an object).", param)
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _close_objects(schema: Any) -> Any:
    """``disable_additional_properties``: every object schema without ``additionalProperties`` gets false."""
    if isinstance(schema, list):
        return [_close_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _close_objects(v) for k, v in schema.items()}
    if (out.get("type") == "object" or "properties" in out) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _choice_text(value: Any, param: str) -> str:
    if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
        raise bad_request(f"{param} must be a non-empty list of strings.", param)
    return json.dumps(value, ensure_ascii=False)


def _from_response_format(rf: dict) -> StructuredSpec | None:
    kind = rf.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredSpec("json", ANY_OBJECT)
    if kind == "json_schema":
        js = rf.get("json_schema")
        if not isinstance(js, dict):
            raise bad_request("response_format json_schema needs a 'json_schema' object with a 'schema'.",
                              "response_format.json_schema")
        return json_schema_spec(js, "response_format.json_schema")
    raise bad_request(f"response_format type {kind!r} is not supported (text, json_object, json_schema).",
                      "response_format")


def json_schema_spec(js: dict, where: str) -> StructuredSpec:
    """The spec of a ``json_schema`` format whose ``schema`` and ``strict`` sit in ``js``, the field ``where``
    (chat's ``response_format.json_schema``, the Responses API's ``text.format``)."""
    if "strict" in js and js["strict"] is not None and not isinstance(js["strict"], bool):
        raise bad_request(f"{where}.strict must be a boolean.", where)
    schema = js.get("schema")
    return StructuredSpec("json", ANY_OBJECT if schema is None else _schema_text(schema, f"{where}.schema"))


def _from_structured_outputs(so: dict) -> StructuredSpec:
    unknown = [k for k in so if k not in _SO_KINDS + _SO_OPTIONS]
    if unknown:
        raise bad_request(f"structured_outputs has unknown fields {unknown}.", "structured_outputs")
    given = [k for k in _SO_KINDS if so.get(k) is not None]
    if len(given) != 1:
        raise bad_request(f"structured_outputs needs exactly one of {list(_SO_KINDS[:5])}, got {given or 'none'}.",
                          "structured_outputs")
    kind, value = given[0], so[given[0]]
    ws = so.get("whitespace_pattern")
    if ws is not None and not isinstance(ws, str):
        raise bad_request("structured_outputs.whitespace_pattern must be a string.", "structured_outputs")
    if kind == "structural_tag":
        raise bad_request("structured_outputs.structural_tag is not supported.", "structured_outputs.structural_tag")
    if kind == "json_object":
        return StructuredSpec("json", ANY_OBJECT, ws)
    if kind == "json":
        if so.get("disable_additional_properties"):
            value = _close_objects(json.loads(value) if isinstance(value, str) else value)
        return StructuredSpec("json", _schema_text(value, "structured_outputs.json"), ws)
    if kind == "choice":
        return StructuredSpec("choice", _choice_text(value, "structured_outputs.choice"))
    if not isinstance(value, str) or not value:
        raise bad_request(f"structured_outputs.{kind} must be a non-empty string.", f"structured_outputs.{kind}")
    return StructuredSpec(kind, value)


def _from_guided(req) -> StructuredSpec | None:
    given = [k for k in ("guided_json", "guided_regex", "guided_choice", "guided_grammar") if getattr(req, k) is not None]
    if not given:
        return None
    if len(given) > 1:
        raise bad_request(f"Give at most one of {given}.", given[1])
    name = given[0]
    value = getattr(req, name)
    if name == "guided_json":
        return StructuredSpec("json", _schema_text(value, name), req.guided_whitespace_pattern)
    if name == "guided_choice":
        return StructuredSpec("choice", _choice_text(value, name))
    if not value:
        raise bad_request(f"{name} must be a non-empty string.", name)
    return StructuredSpec("regex" if name == "guided_regex" else "grammar", value)


def check_size(spec: StructuredSpec, param: str, limits: RequestLimits) -> StructuredSpec:
    """``spec`` when it is within ``--max-constraint-bytes``; else a 400 naming ``param``."""
    size = len(spec.text.encode("utf-8", "surrogatepass")) + len(spec.whitespace_pattern or "")
    if size > limits.max_constraint_bytes:
        raise bad_request(f"{param}: the constraint is {size} bytes; this server takes at most "
                          f"{limits.max_constraint_bytes} (--max-constraint-bytes).", param)
    return spec


def request_constraint(req, limits: RequestLimits | None = None) -> tuple[str, StructuredSpec] | None:
    """(field, spec) of a completions or chat request's output constraint (None: free text). 400 on a
    malformed, unsupported or oversized one; nothing is compiled here. Called once per request, by
    ``worker.api.sampling.validate_sampling``."""
    limits = limits or RequestLimits()
    found = []
    try:
        if req.response_format is not None:
            spec = _from_response_format(req.response_format)
            if spec is not None:
                found.append(("response_format", spec))
        if req.structured_outputs is not None:
            found.append(("structured_outputs", _from_structured_outputs(req.structured_outputs)))
        guided = _from_guided(req)
        if guided is not None:
            found.append(("guided_*", guided))
    except RecursionError:
        raise bad_request("The output constraint is nested too deeply.", "response_format") from None
    if len(found) > 1:
        raise bad_request(f"Give one structured-output constraint, not {[n for n, _ in found]}.", found[1][0])
    return (found[0][0], check_size(found[0][1], found[0][0], limits)) if found else None
