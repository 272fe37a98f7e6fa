"""Hostile and malformed requests for the fuzz suites of the gateway and the worker, and for
``swiftserve bench serve hostile``.

``hostile_bodies()``: a Hypothesis strategy of raw request bodies: a valid completion,
chat or Responses body whose fields (every declared one, plus unknown ones) are replaced by
values of every JSON type (huge and negative integers, NaN and infinities, empty and long
strings, nested containers), bytes that are not JSON at all (invalid UTF-8, deep nesting,
truncated documents), and the families of the structured surface (``FAMILIES``): output
constraints (JSON schemas with ``$ref`` cycles and odd keywords, regexes with huge
quantifiers, grammars that refer to themselves, choice lists), tools (``parameters`` of every
type, cyclic schemas, ``tool_choice`` variants, tool-call history), Responses items and
``text.format``, and scoring fields (``echo``, ``logprobs``, ``prompt_logprobs``, ``max_tokens``
0). ``fixed_cases``: hand-picked hostile requests (enormous prompts, out-of-range token ids,
many stop strings, large ``n``, oversized bodies), and ``REGRESSIONS``: the requests of
issue 47 that killed or stalled a worker or opened the gateway's circuit.

``check_answer(resp)`` is the property every case must satisfy: never a 5xx, and every
4xx is an OpenAI-style JSON error. ``Tally`` counts cases and server errors for
``reliability_log``.
"""

from __future__ import annotations

import json

from hypothesis import strategies as st

from worker.api.chat.protocol import ChatCompletionRequest
from worker.api.completions.protocol import CompletionRequest
from worker.api.responses.protocol import ResponsesRequest

CMPL, CHAT, RESP = "/v1/completions", "/v1/chat/completions", "/v1/responses"
VALID = {CMPL: {"model": "fake-model", "prompt": "Hello", "max_tokens": 4},
         CHAT: {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
         RESP: {"model": "fake-model", "input": "hi", "max_output_tokens": 4}}
FIELDS = {CMPL: sorted(CompletionRequest.model_fields), CHAT: sorted(ChatCompletionRequest.model_fields),
          RESP: sorted(ResponsesRequest.model_fields)}

BIG_INTS = st.sampled_from([0, -1, 1, 2**31, 2**63 - 1, 2**63, -(2**63) - 1, 2**64, 10**30, -(10**30)])
FLOATS = st.sampled_from([float("nan"), float("inf"), float("-inf"), -0.0, 1e308, -1e308, 5e-324, 0.5, 2.5, -2.5])
LEAF = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), BIG_INTS, FLOATS,
                 st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40),
                 st.sampled_from(["", " ", "\x00", "\u202e", "é" * 50, "<|im_end|>", "{{ 7*7 }}",
                                  "../../etc/passwd", "%s%n", "a\r\nX-Injected: 1"]))
JSON_VALUES = st.recursive(LEAF, lambda inner: st.one_of(st.lists(inner, max_size=6),
                                                          st.dictionaries(st.text(max_size=12), inner, max_size=5)),
                           max_leaves=20)


# ---- the structured surface ---------------------------------------------------------------------
CYCLE = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
SCHEMAS = st.one_of(
    st.sampled_from([{"$ref": "#"}, CYCLE, {"type": "object"}, {"type": "integer", "minimum": 5, "maximum": 1},
                     {"type": "string", "pattern": "a{100000}"}, {"type": "string", "format": "no-such-format"},
                     {"allOf": [{"type": "string"}, {"type": "integer"}]}, {"not": {}}, {"enum": []},
                     {"type": "array", "minItems": 10**9}, {"$ref": "#/nowhere"}, {"type": "object", "properties": {
                         f"p{i}": {"type": "string"} for i in range(200)}}, {"x-guidance": {"lenient": True}},
                     {"oneOf": [{"$ref": "#"}] * 3}, True, False, {"type": "strnig"}]),
    st.dictionaries(st.sampled_from(["type", "properties", "items", "$ref", "enum", "const", "required",
                                     "additionalProperties", "anyOf", "$defs", "pattern", "maxLength"]),
                    JSON_VALUES, max_size=4),
    JSON_VALUES)
REGEXES = st.one_of(st.sampled_from(["a{1000}", "a{0,99999}", "(a|b)*c{500}", "(", "[z-a]", "\\", "(?<n>x)\\k<n>",
                                     ".*", "", "x{2}{3}", "(((((((a)))))))*", "\\p{L}+", "[^\\x00-\\x{10FFFF}]"]),
                    st.text(max_size=30))
GRAMMARS = st.one_of(st.sampled_from(["root ::= root", "root ::= a\na ::= root", "start: start", "root ::= ",
                                      'root ::= "a"*', "start: foo", 'root ::= [a-z]{1,99999}', "%import x",
                                      'root ::= "x" | root root']), st.text(max_size=40))
CONSTRAINTS = st.one_of(
    st.builds(lambda v: {"structured_outputs": {"json": v}}, SCHEMAS),
    st.builds(lambda v: {"structured_outputs": {"regex": v}}, REGEXES),
    st.builds(lambda v: {"structured_outputs": {"grammar": v}}, GRAMMARS),
    st.builds(lambda v: {"structured_outputs": {"choice": v}}, st.one_of(st.lists(st.text(max_size=8), max_size=8),
                                                                          JSON_VALUES)),
    st.builds(lambda k, v: {"structured_outputs": {k: v}}, st.sampled_from(
        ["json", "regex", "choice", "grammar", "json_object", "structural_tag", "nope", "whitespace_pattern"]),
        JSON_VALUES),
    st.builds(lambda v: {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": v}}},
              SCHEMAS),
    st.builds(lambda v: {"response_format": v}, JSON_VALUES),
    st.builds(lambda v: {"guided_json": v}, SCHEMAS), st.builds(lambda v: {"guided_regex": v}, REGEXES),
    st.builds(lambda v: {"guided_grammar": v}, GRAMMARS), st.builds(lambda v: {"guided_choice": v}, JSON_VALUES))
TOOL = st.one_of(
    st.builds(lambda name, params: {"type": "function", "function": {"name": name, "parameters": params}},
              st.sampled_from(["f", "get_weather", "", "x" * 65, "a b", "f"]), st.one_of(SCHEMAS, JSON_VALUES)),
    JSON_VALUES)
TOOLS = st.builds(lambda tools, choice, parallel: {"tools": tools, "tool_choice": choice,
                                                   "parallel_tool_calls": parallel},
                  st.lists(TOOL, max_size=4),
                  st.one_of(st.sampled_from(["auto", "required", "none", "any", None,
                                             {"type": "function", "function": {"name": "f"}},
                                             {"type": "function", "function": {"name": "missing"}}]), JSON_VALUES),
                  st.one_of(st.booleans(), JSON_VALUES))
HISTORY = st.builds(lambda calls: {"messages": [{"role": "user", "content": "hi"},
                                                {"role": "assistant", "content": None, "tool_calls": calls},
                                                {"role": "tool", "tool_call_id": "c", "content": "42"}]},
                    st.one_of(st.lists(st.fixed_dictionaries({"id": st.just("c"), "type": st.just("function"),
                                                               "function": st.fixed_dictionaries(
                                                                   {"name": st.text(max_size=5),
                                                                    "arguments": st.one_of(st.text(max_size=10),
                                                                                           JSON_VALUES)})}),
                                       max_size=3), JSON_VALUES))
SCORING = st.fixed_dictionaries({}, optional={
    "echo": st.one_of(st.booleans(), JSON_VALUES), "logprobs": st.one_of(st.integers(-5, 10**6), JSON_VALUES),
    "prompt_logprobs": st.one_of(st.integers(-5, 10**6), JSON_VALUES), "max_tokens": st.sampled_from([0, 1, -1, None]),
    "top_logprobs": st.integers(-1, 100), "n": st.integers(0, 4), "stream": st.booleans(),
    "prompt": st.one_of(st.just("Hello"), st.lists(st.integers(-2, 600), max_size=6))})
RESPONSES = st.fixed_dictionaries({"input": st.one_of(
    st.text(max_size=20),
    st.lists(st.one_of(
        st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "developer", "tool", "x"]),
                               "content": st.one_of(st.text(max_size=10), JSON_VALUES)}),
        st.fixed_dictionaries({"type": st.sampled_from(["function_call", "function_call_output", "reasoning",
                                                        "message", "web_search_call"]),
                               "call_id": st.one_of(st.just("c"), JSON_VALUES),
                               "name": st.one_of(st.just("f"), JSON_VALUES),
                               "arguments": st.one_of(st.just("{}"), st.just("[1]"), JSON_VALUES),
                               "output": st.one_of(st.just("ok"), JSON_VALUES)}),
        JSON_VALUES), max_size=4))},
    optional={"text": st.one_of(st.builds(lambda v: {"format": {"type": "json_schema", "name": "x", "schema": v}},
                                          SCHEMAS), JSON_VALUES),
              "tools": st.lists(st.one_of(st.builds(lambda p: {"type": "function", "name": "f", "parameters": p},
                                                    SCHEMAS), JSON_VALUES), max_size=3),
              "tool_choice": st.one_of(st.sampled_from(["auto", "required", "none"]), JSON_VALUES),
              "instructions": st.one_of(st.text(max_size=10), JSON_VALUES),
              "store": JSON_VALUES, "previous_response_id": JSON_VALUES})
FAMILIES = ("structured", "tools", "responses", "scoring")


@st.composite
def family_bodies(draw, family: str | None = None) -> tuple[str, bytes]:
    """A body of one of ``FAMILIES`` (drawn when ``family`` is None): a valid request with hostile values
    in the fields of that part of the API."""
    family = family or draw(st.sampled_from(FAMILIES))
    if family == "structured":
        path = draw(st.sampled_from([CMPL, CHAT]))
        body = {**VALID[path], **draw(CONSTRAINTS)}
    elif family == "tools":
        path, body = CHAT, {**VALID[CHAT], **draw(TOOLS)}
        if draw(st.booleans()):
            body.update(draw(HISTORY))
    elif family == "responses":
        path, body = RESP, {**VALID[RESP], **draw(RESPONSES)}
    else:
        path = draw(st.sampled_from([CMPL, CHAT]))
        body = {**VALID[path], **draw(SCORING)}
        if path == CHAT:
            body.pop("prompt", None)
    return path, json.dumps(body, allow_nan=True).encode("utf-8", "surrogatepass")


@st.composite
def hostile_bodies(draw) -> tuple[str, bytes]:
    path = draw(st.sampled_from([CMPL, CHAT, RESP]))
    kind = draw(st.sampled_from(["fields", "fields", "fields", "raw", "family", "family"]))
    if kind == "family":
        return draw(family_bodies())
    if kind == "raw":
        raw = draw(st.one_of(
            st.binary(max_size=200),
            st.sampled_from([b"", b"{", b"[]", b"null", b"\xff\xfe\xfd", b'{"model": "fake-model", "prompt": "\xff"}',
                             b"[" * 5000 + b"]" * 5000, b'{"a":' * 3000 + b"1" + b"}" * 3000,
                             b'{"model": "fake-model", "prompt": "x", "max_tokens": 1e999}',
                             b'{"model": "fake-model", "prompt": "x", "temperature": NaN}',
                             b'{"model": "fake-model", "prompt": "x", "top_p": Infinity}',
                             b'{"model": "fake-model", "prompt": "x", "n": -Infinity}',
                             b'{"model": "fake-model", "prompt": "\\ud800 lone surrogate", "max_tokens": 2}',
                             b'{"model": "fake-model", "messages": [{"role": "user", "content": "\\udfff"}]}'])))
        return path, raw
    body = dict(VALID[path])
    for _ in range(draw(st.integers(1, 4))):
        name = draw(st.one_of(st.sampled_from(FIELDS[path]), st.text(min_size=1, max_size=15)))
        if draw(st.booleans()) and name in body:
            del body[name]
        else:
            body[name] = draw(JSON_VALUES)
    return path, json.dumps(body, allow_nan=True).encode("utf-8", "surrogatepass")


def fixed_cases(max_body: int) -> list[tuple[str, bytes, dict]]:
    """(path, body, headers) hostile requests beyond what the strategy draws."""
    m = "fake-model"
    cases = [
        (CMPL, {"model": m, "prompt": "word " * 40000, "max_tokens": 4}),           # enormous prompt
        (CMPL, {"model": m, "prompt": list(range(5000)), "max_tokens": 4}),         # long id prompt
        (CMPL, {"model": m, "prompt": [[1, 2], [3, 10**12]]}),                       # id out of range
        (CMPL, {"model": m, "prompt": [-5]}),
        (CMPL, {"model": m, "prompt": [1, 10**10], "echo": True, "max_tokens": 2}),   # decoded for echo
        (CMPL, {"model": m, "prompt": [[1], [2**63 - 1]], "echo": True, "max_tokens": 2}),
        (CMPL, {"model": m, "prompt": "x", "stop": ["s%d" % i for i in range(5000)], "max_tokens": 4}),
        (CMPL, {"model": m, "prompt": "x", "stop_token_ids": [2**62], "min_tokens": 2, "max_tokens": 4}),
        (CMPL, {"model": m, "prompt": "x", "n": 10**6}),
        (CMPL, {"model": m, "prompt": ["x"] * 2000, "n": 128, "max_tokens": 1}),
        (CMPL, {"model": m, "prompt": "x", "logprobs": 10**9}),
        (CHAT, {"model": m, "messages": [{"role": "user", "content": "x" * 100000}]}),
        (CHAT, {"model": m, "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}),
        (CHAT, {"model": m, "messages": [{"role": "user", "content": "hi"}] * 5000, "max_tokens": 2}),
        (CHAT, {"model": m, "messages": [{"role": "user", "content": "hi"}],
                "chat_template": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"}),
        (CHAT, {"model": m, "messages": [{"role": "user", "content": "hi"}],
                "chat_template_kwargs": {"messages": [], "tokenize": True}}),
        (CMPL, {"model": "../" * 50 + "etc/passwd", "prompt": "x"}),
    ]
    out = [(p, json.dumps(b).encode(), {}) for p, b in cases]
    out.append((CMPL, b'{"model": "' + b"x" * (max_body + 10) + b'", "prompt": "x"}', {}))      # oversized body
    out.append((CMPL, json.dumps(VALID[CMPL]).encode(), {"content-type": "text/plain"}))
    out.append((CMPL, json.dumps(VALID[CMPL]).encode(), {"authorization": "Bearer " + "k" * 8000}))
    out.append((CMPL, json.dumps(VALID[CMPL]).encode(), {"x-forwarded-for": "1.2.3.4, evil", "host": "evil.test"}))
    return out


def regressions() -> list[tuple[str, dict]]:
    """Issue 47's requests (path, body): each must be a 4xx JSON error (or an answer), fast, with no
    library internals, and leave the worker healthy."""
    m, msg = "fake-model", [{"role": "user", "content": "hi"}]
    cycle_tool = {"type": "function", "function": {"name": "f", "parameters": CYCLE}}
    return [
        (CHAT, {"model": m, "messages": msg, "structured_outputs": {"regex": "a{1000000}"}, "max_tokens": 4}),
        (CHAT, {"model": m, "messages": msg, "structured_outputs": {"grammar": "root ::= root"}}),
        (CHAT, {"model": m, "messages": msg, "response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"$ref": "#"}}}}),
        (CHAT, {"model": m, "messages": msg, "structured_outputs": {"json": CYCLE}}),
        (CHAT, {"model": m, "messages": msg, "tools": [cycle_tool],
                "tool_choice": {"type": "function", "function": {"name": "f"}}}),
        (RESP, {"model": m, "input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": CYCLE}}}),
        (CHAT, {"model": m, "messages": msg, "structured_outputs": {"choice": [f"c{i}" for i in range(100_000)]}}),
        (CMPL, {"model": m, "prompt": "x", "stop": [f"s{i}" for i in range(500_000)], "n": 2}),
        (CHAT, {"model": m, "messages": msg, "tools": [{"type": "function", "function": {"name": f"f{i}"}}
                                                       for i in range(40_000)]}),
        (CHAT, {"model": m, "messages": msg, "tools": [{"type": "function", "function": {"name": "f",
                                                                                         "parameters": []}}]}),
        (CMPL, {"model": m, "prompt": "word " * 1_400_000}),
        (RESP, {"model": m, "input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]}),
        ("/detokenize", {"model": m, "tokens": ["1", True]}),
    ]


def check_answer(status: int, content: bytes, headers) -> None:
    assert status < 500, (status, content[:300])
    if status >= 400:
        ctype = headers.get("content-type") or ""
        ctype = ctype[0] if isinstance(ctype, list) else ctype          # schemathesis: lists of values
        assert ctype.startswith("application/json"), (status, content[:200])
        err = json.loads(content)["error"]
        assert isinstance(err["message"], str) and err["message"] and isinstance(err["type"], str), err
        assert not any(bad in err["message"] for bad in INTERNALS), err["message"]


INTERNALS = ("<state>", "<backtrace>", "<non-verbose/>", "Traceback (most recent")     # never in an error message


class Tally:
    def __init__(self) -> None:
        self.cases = 0
        self.server_errors = 0

    def saw(self, status: int) -> None:
        self.cases += 1
        self.server_errors += status >= 500
