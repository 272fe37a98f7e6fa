"""Structured-output request fields at the edge (fake engine): each way of asking becomes one
``StructuredSpec`` in the engine's parameters, and a wrong or unsupported one is a 400 naming it
(the constraint compiled without a tokenizer, before the engine sees anything)."""

import json

import pytest

from refengine.structured.spec import StructuredSpec

CMPL, CHAT = "/v1/completions", "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]
SCHEMA = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}, "required": ["b"]}
COMPACT = json.dumps(SCHEMA, separators=(",", ":"))          # property order kept: it is the output's order


def sent(client, engine, path, **body):
    body.setdefault("model", "fake-model")
    body.setdefault("max_tokens", 2)
    body.setdefault("messages" if path == CHAT else "prompt", MSG if path == CHAT else "x")
    r = client.post(path, json=body)
    assert r.status_code == 200, r.text
    (_, params), = engine.requests.values()
    return params.structured


@pytest.mark.parametrize("path", [CMPL, CHAT])
@pytest.mark.parametrize("fields,expected", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}},
     StructuredSpec("json", COMPACT)),
    ({"response_format": {"type": "json_object"}}, StructuredSpec("json", '{"type":"object"}')),
    ({"response_format": {"type": "text"}}, None),
    ({"structured_outputs": {"json": SCHEMA}}, StructuredSpec("json", COMPACT)),
    ({"structured_outputs": {"json": json.dumps(SCHEMA), "whitespace_pattern": " ?"}},
     StructuredSpec("json", COMPACT, " ?")),
    ({"structured_outputs": {"choice": ["yes", "no"]}}, StructuredSpec("choice", '["yes", "no"]')),
    ({"structured_outputs": {"regex": "[0-9]{3}"}}, StructuredSpec("regex", "[0-9]{3}")),
    ({"structured_outputs": {"grammar": 'root ::= "a" | "b"'}}, StructuredSpec("grammar", 'root ::= "a" | "b"')),
    ({"structured_outputs": {"json_object": True}}, StructuredSpec("json", '{"type":"object"}')),
    ({"guided_json": json.dumps(SCHEMA)}, StructuredSpec("json", COMPACT)),
    ({"guided_choice": ["a", "b"]}, StructuredSpec("choice", '["a", "b"]')),
    ({"guided_regex": "x+"}, StructuredSpec("regex", "x+")),
    ({"guided_grammar": 'start: "a"+'}, StructuredSpec("grammar", 'start: "a"+')),
])
def test_each_field_becomes_one_spec(client_for, path, fields, expected):
    client, engine = client_for()
    assert sent(client, engine, path, **fields) == expected


def test_disable_additional_properties_closes_every_object(client_for):
    client, engine = client_for()
    nested = {"type": "object", "properties": {"inner": {"type": "object", "properties": {"x": {"type": "integer"}}}}}
    spec = sent(client, engine, CMPL, structured_outputs={"json": nested, "disable_additional_properties": True})
    schema = json.loads(spec.text)
    assert schema["additionalProperties"] is False
    assert schema["properties"]["inner"]["additionalProperties"] is False


@pytest.mark.parametrize("path,body,param,contains", [
    (CMPL, {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}}}},
     "response_format", "uniqueItems"),
    (CMPL, {"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs", None),
    (CMPL, {"structured_outputs": {"grammar": "root ::= ("}}, "structured_outputs", None),
    (CMPL, {"structured_outputs": {"json": SCHEMA, "regex": "x"}}, "structured_outputs", None),
    (CMPL, {"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs.structural_tag", None),
    (CMPL, {"structured_outputs": {"choice": ["a"], "backend": "x"}}, "structured_outputs", "backend"),
    (CMPL, {"structured_outputs": {"choice": ["a"]}, "guided_regex": "x"}, "guided_*", None),
    (CMPL, {"guided_json": {"type": "object"}, "guided_regex": "x"}, "guided_regex", None),
    (CMPL, {"response_format": {"type": "structural_tag"}}, "response_format", None),
    (CHAT, {"response_format": {"type": "json_schema"}}, "response_format.json_schema", None),
    (CHAT, {"response_format": {"type": "json_object"}, "min_tokens": 3}, "min_tokens", None),
    (CHAT, {"guided_decoding_backend": "xgrammar", "guided_regex": "x"}, "guided_decoding_backend", None),
])
def test_wrong_or_unsupported_constraints_are_400(client_for, path, body, param, contains):
    client, engine = client_for()
    body = {"model": "fake-model", "max_tokens": 2, **body}
    body.setdefault("messages" if path == CHAT else "prompt", MSG if path == CHAT else "x")
    r = client.post(path, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    if contains:
        assert contains in err["message"], err["message"]
    assert engine.requests == {}
