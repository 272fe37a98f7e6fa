"""The gateway's edge for /v1/responses, /tokenize and /detokenize: required fields, where
``model`` is optional, how a Responses stream ends (its terminal event, no [DONE]), the
prefix rendering and token estimate of a Responses request. (Forwarding them to a real
worker: tests/worker/test_worker_api_real.py.)"""

import json

import pytest

from gateway.auth import estimate_tokens, requested_tokens
from gateway.edge import EdgeError, parse_body
from gateway.prefix import render_prompt
from gateway.streaming import StreamStats, stream_ended


def body(**kw) -> bytes:
    return json.dumps(kw).encode()


@pytest.mark.parametrize("path, doc, param", [
    ("/v1/responses", {"input": "hi"}, "model"),
    ("/v1/responses", {"model": "m"}, "input"),
    ("/v1/responses", {"model": "m", "input": []}, "input"),
    ("/v1/responses", {"model": "m", "input": 5}, "input"),
    ("/tokenize", {}, "prompt"),
    ("/tokenize", {"model": 5, "prompt": "x"}, "model"),
    ("/detokenize", {"tokens": "1 2"}, "tokens"),
])
def test_required_fields(path, doc, param):
    with pytest.raises(EdgeError) as e:
        parse_body(path, body(**doc))
    assert e.value.status == 400 and e.value.param == param


def test_model_is_optional_for_the_tokenizer_endpoints():
    assert parse_body("/tokenize", body(prompt="x")) == {"prompt": "x"}
    assert parse_body("/tokenize", body(messages=[{"role": "user", "content": "x"}]))
    assert parse_body("/detokenize", body(tokens=[1, 2]))
    assert parse_body("/v1/responses", body(model="m", input=[{"role": "user", "content": "x"}]))


def test_a_body_orjson_refuses_reads_ints_as_orjson_would():
    # NaN sends the body to Python's parser; an int beyond 64 bits must not survive it, or writing the
    # body again (orjson, when it is forwarded) fails with a 500 (found by benchmarks/serve/hostile.py).
    import orjson

    doc = parse_body("/v1/completions", b'{"model": "m", "prompt": "x", "temperature": NaN, '
                                        b'"seed": 123456789012345678901234567890, "max_tokens": 18446744073709551615}')
    assert doc["seed"] == 1.2345678901234568e29 and doc["max_tokens"] == 18446744073709551615
    orjson.dumps(doc)


def test_responses_streams_end_with_their_terminal_event():
    created = b'event: response.created\ndata: {"type":"response.created"}\n\n'
    for end in (b"completed", b"incomplete", b"failed"):
        assert stream_ended(created + b"event: response." + end + b'\ndata: {"response":{}}\n\n')
    assert not stream_ended(created)
    assert not stream_ended(b'event: response.completed\ndata: {}\n\nevent: response.output_text.delta\n'
                            b'data: {"delta":"x"}\n\n')
    assert stream_ended(b'data: {"choices":[]}\n\ndata: [DONE]\n\n') and not stream_ended(b'data: {}\n\n')
    stats = StreamStats(0.0)
    stats.feed(created + b'event: response.output_text.delta\ndata: {"delta":"Hi"}\n\n')
    assert stats.first_token is not None
    stats.feed(b'event: response.completed\ndata: {"response":{"usage":{"input_tokens":3,"output_tokens":7}}}\n\n')
    assert stats.completion_tokens == 7


def test_responses_prefix_rendering_and_token_estimate():
    doc = {"model": "m", "instructions": "Be brief.", "input": "What is 2+2?", "max_output_tokens": 10}
    same = {"model": "m", "instructions": "Be brief.", "input": [{"role": "user", "content": "What is 2+2?"}]}
    assert render_prompt("/v1/responses", doc) == render_prompt("/v1/responses", same)
    assert render_prompt("/v1/responses", doc).startswith("<system>Be brief.\n<user>What is 2+2?")
    assert requested_tokens(doc) == 10 and estimate_tokens(doc) == len("What is 2+2?") / 4 + 10


def compact(value) -> str:
    return json.dumps(value, separators=(",", ":"))


def test_tools_and_structured_fields_count_and_hash():
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    call = [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]
    msgs = [{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": None, "tool_calls": call},
            {"role": "tool", "tool_call_id": "call_1", "content": "18C"}]
    plain = {"messages": msgs[:1], "max_tokens": 10}
    full = {"messages": msgs, "tools": tools, "tool_choice": "required", "max_tokens": 10,
            "response_format": {"type": "json_object"}, "structured_outputs": {"choice": ["a"]}}
    assert estimate_tokens(full) > estimate_tokens(plain) + (len(compact(tools)) + len(compact(call))) / 4 - 1
    text = render_prompt("/v1/chat/completions", full)
    assert "get_weather" in text and "Paris" in text and "18C" in text
    other = dict(full, tools=[{"type": "function", "function": {"name": "get_time"}}])
    assert render_prompt("/v1/chat/completions", other) != text


def test_responses_tools_and_call_items_count_and_hash():
    tool = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
    items = [{"role": "user", "content": "Weather in Paris?"},
             {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
             {"type": "function_call_output", "call_id": "c1", "output": "18C"}]
    doc = {"model": "m", "input": items, "tools": [tool], "max_output_tokens": 10}
    bare = {"model": "m", "input": items[:1], "max_output_tokens": 10}
    assert estimate_tokens(doc) >= estimate_tokens(bare) + (len(compact([tool])) + len(items[1]["arguments"])
                                                           + len("18C")) / 4 - 1
    text = render_prompt("/v1/responses", doc)
    assert "get_weather" in text and "Paris" in text and "18C" in text
    assert estimate_tokens({"model": "m", "input": "hi", "tools": [tool]}) > estimate_tokens({"model": "m", "input": "hi"})
