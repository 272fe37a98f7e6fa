"""The worker's cheap request limits and its error classes (issue 47), on the fake engine.

Each limit is a 400 naming the field, before anything is tokenised or compiled; a constraint
that does not compile within ``--constraint-timeout`` is a 400 (its compiler process is
stopped); a request that fails alone in the engine is the request's fault (a constraint: 400
``constraint_failed``; anything else: 500 marked ``x-swiftserve-fault: request``, which a
gateway neither retries nor counts against the worker); ``/detokenize`` takes only integers;
a tool's ``parameters`` must be an object; ``/v1/responses`` errors name Responses fields.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from worker_test_fakes import FakeEngineClient

from refengine.outputs import RequestFailed
from worker.limits import RequestLimits

MODEL = "fake-model"
MSG = [{"role": "user", "content": "hi"}]


class FailingEngine(FakeEngineClient):
    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.error = error

    async def generate(self, request_id, prompt_token_ids, params):
        raise self.error
        yield  # pragma: no cover - makes this an async generator


def err(r, status: int, param: str | None):
    assert r.status_code == status, r.text
    e = r.json()["error"]
    assert e["param"] == param, e
    return e


@pytest.fixture
def limited(client_for):
    c, _ = client_for(limits=RequestLimits(max_stop_strings=3, max_tools=2, max_constraint_bytes=200,
                                           constraint_timeout=30.0))
    return c


def test_cheap_limits_name_the_field(limited):
    r = limited.post("/v1/completions", json={"model": MODEL, "prompt": "x", "stop": ["a", "b", "c", "d"]})
    assert "--max-stop-strings" in err(r, 400, "stop")["message"]
    tools = [{"type": "function", "function": {"name": f"f{i}"}} for i in range(3)]
    r = limited.post("/v1/chat/completions", json={"model": MODEL, "messages": MSG, "tools": tools})
    assert "--max-tools" in err(r, 400, "tools")["message"]
    r = limited.post("/v1/chat/completions", json={"model": MODEL, "messages": MSG,
                                                   "structured_outputs": {"choice": [f"c{i}" for i in range(100)]}})
    assert "--max-constraint-bytes" in err(r, 400, "structured_outputs")["message"]
    big = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(20)}}
    r = limited.post("/v1/chat/completions", json={"model": MODEL, "messages": MSG, "tools": [
        {"type": "function", "function": {"name": "f", "parameters": big}}]})
    err(r, 400, "tools.0.function.parameters")
    r = limited.post("/v1/chat/completions", json={"model": MODEL, "messages": MSG, "stop": ["a", "b"],
                                                   "max_tokens": 2})
    assert r.status_code == 200, r.text


def test_prompt_bytes_are_checked_before_tokenisation(client_for):
    c, engine = client_for()              # context 256 tokens: a prompt of more bytes than that can hold is refused
    long = "é" * 200_000
    e = err(c.post("/v1/completions", json={"model": MODEL, "prompt": long}), 400, "prompt")
    assert "maximum context length" in e["message"] and not engine.requests
    err(c.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": long}]}),
        400, "messages")
    r = c.post("/v1/completions", json={"model": MODEL, "prompt": "word " * 20_000, "truncate_prompt_tokens": 8,
                                        "max_tokens": 2})
    assert r.status_code == 200, r.text       # truncation: the prompt is cut after tokenisation
    c2, _ = client_for(limits=RequestLimits(max_prompt_bytes=10))
    assert "--max-prompt-bytes" in err(c2.post("/v1/completions", json={"model": MODEL, "prompt": "x" * 11}),
                                       400, "prompt")["message"]


def test_constraints_compile_at_the_edge_with_a_time_limit(client_for):
    c, engine = client_for(limits=RequestLimits(constraint_timeout=0.2))
    # 2,000,000 repetitions compiled within 0.2 s in some runs under load (a 200, not the time limit's
    # 400): the time-limit case gets 2 ms, which no compile meets, then a limit any compile meets.
    serving = c.app.state.serving
    for timeout, so, why in ((0.2, {"grammar": "root ::= root"}, "allows no output"),
                             (0.2, {"json": {"$ref": "#"}}, "allows no output"),
                             (0.2, {"regex": "(unclosed"}, "regex"),
                             (0.002, {"regex": "a{2000000}"}, "time limit")):
        serving.config = replace(serving.config, limits=RequestLimits(constraint_timeout=timeout))
        r = c.post("/v1/chat/completions", json={"model": MODEL, "messages": MSG, "structured_outputs": so})
        e = err(r, 400, "structured_outputs")
        assert why in e["message"] and "<state>" not in e["message"] and "backtrace" not in e["message"], e
    assert not engine.requests                      # the engine never saw them
    serving.config = replace(serving.config, limits=RequestLimits(constraint_timeout=30.0))
    r = c.post("/v1/chat/completions", json={"model": MODEL, "messages": MSG, "max_tokens": 3,
                                             "structured_outputs": {"regex": "[a-z]+"}})
    assert r.status_code == 200, r.text             # the compiler was started again after the timeout


def test_failures_in_the_engine_are_the_requests(client_for):
    c, _ = client_for(FailingEngine(RequestFailed("the output constraint could not be followed: x", constraint=True)))
    r = c.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
    assert err(r, 400, None)["code"] == "constraint_failed"
    c, _ = client_for(FailingEngine(RequestFailed("the engine failed on this request: IndexError: 7")))
    r = c.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
    assert err(r, 500, None)["code"] == "engine_request_failed"
    assert r.headers["x-swiftserve-fault"] == "request"
    r = c.post("/v1/completions", json={"model": MODEL, "prompt": "x", "stream": True})
    assert r.status_code == 200 and '"code":"engine_request_failed"' in r.text and r.text.endswith("[DONE]\n\n")


def test_strict_types_on_detokenize_and_tool_parameters(client):
    for tokens in (["1"], [True], [1.0], [1, "2"]):
        err(client.post("/detokenize", json={"tokens": tokens}), 400, "tokens.0" if len(tokens) == 1 else "tokens.1")
    assert client.post("/detokenize", json={"tokens": [1, 2]}).status_code == 200
    for params in ([], "", "{}", 5):
        r = client.post("/v1/chat/completions", json={"model": MODEL, "messages": MSG, "tools": [
            {"type": "function", "function": {"name": "f", "parameters": params}}]})
        err(r, 400, "tools.0.function.parameters")


def test_responses_errors_name_responses_fields(client):
    r = client.post("/v1/responses", json={"model": MODEL, "instructions": "be brief", "input": [
        {"role": "user", "content": "hi"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "[1]"}]})
    e = err(r, 400, "input.2")
    assert "messages" not in e["message"], e
    r = client.post("/v1/responses", json={"model": MODEL, "input": "hi", "tools": [
        {"type": "function", "name": "f", "parameters": {"$ref": "#"}}], "tool_choice": "required"})
    e = err(r, 400, "tools.0.parameters")
    assert "function.parameters" not in e["message"], e
    r = client.post("/v1/responses", json={"model": MODEL, "input": "hi", "text": {"format": {
        "type": "json_schema", "name": "x", "schema": {"$ref": "#"}}}})
    assert err(r, 400, "text.format")["message"].startswith("text.format")
