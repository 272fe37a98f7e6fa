"""Hostile and malformed requests for the fuzz suites of the gateway and the worker.

``hostile_bodies()``: a Hypothesis strategy of raw request bodies: a valid completion or
chat body whose fields (every declared one, plus unknown ones) are replaced by values of
every JSON type (huge and negative integers, NaN and infinities, empty and long strings,
nested containers), plus bytes that are not JSON at all (invalid UTF-8, deep nesting,
truncated documents). ``FIXED_CASES``: hand-picked hostile requests (enormous prompts,
out-of-range token ids, many stop strings, large ``n``, oversized bodies).

``check_answer(resp)`` is the property every case must satisfy: never a 5xx, and every
4xx is an OpenAI-style JSON error. ``Tally`` counts cases and server errors for
``reliability_log``.
"""

from __future__ import annotations

import json

from hypothesis import strategies as st

from worker.protocol import ChatCompletionRequest, CompletionRequest

CMPL, CHAT = "/v1/completions", "/v1/chat/completions"
VALID = {CMPL: {"model": "fake-model", "prompt": "Hello", "max_tokens": 4},
         CHAT: {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}}
FIELDS = {CMPL: sorted(CompletionRequest.model_fields), CHAT: sorted(ChatCompletionRequest.model_fields)}

BIG_INTS = st.sampled_from([0, -1, 1, 2**31, 2**63 - 1, 2**63, -(2**63) - 1, 2**64, 10**30, -(10**30)])
FLOATS = st.sampled_from([float("nan"), float("inf"), float("-inf"), -0.0, 1e308, -1e308, 5e-324, 0.5, 2.5, -2.5])
LEAF = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), BIG_INTS, FLOATS,
                 st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40),
                 st.sampled_from(["", " ", "\x00", "\u202e", "é" * 50, "<|im_end|>", "{{ 7*7 }}",
                                  "../../etc/passwd", "%s%n", "a\r\nX-Injected: 1"]))
JSON_VALUES = st.recursive(LEAF, lambda inner: st.one_of(st.lists(inner, max_size=6),
                                                          st.dictionaries(st.text(max_size=12), inner, max_size=5)),
                           max_leaves=20)


@st.composite
def hostile_bodies(draw) -> tuple[str, bytes]:
    path = draw(st.sampled_from([CMPL, CHAT]))
    kind = draw(st.sampled_from(["fields", "fields", "fields", "raw"]))
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


def check_answer(status: int, content: bytes, headers) -> None:
    assert status < 500, (status, content[:300])
    if status >= 400:
        ctype = headers.get("content-type") or ""
        ctype = ctype[0] if isinstance(ctype, list) else ctype          # schemathesis: lists of values
        assert ctype.startswith("application/json"), (status, content[:200])
        err = json.loads(content)["error"]
        assert isinstance(err["message"], str) and err["message"] and isinstance(err["type"], str), err


class Tally:
    def __init__(self) -> None:
        self.cases = 0
        self.server_errors = 0

    def saw(self, status: int) -> None:
        self.cases += 1
        self.server_errors += status >= 500
