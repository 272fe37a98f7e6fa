"""Tool calling at the edge (fake engine with scripted outputs, the openai SDK on a real server):
the tool plan (constraint for "required" / a named function), the tools and the call history
shown to a template that does not render them, the parsers of the auto mode, and the OpenAI
shapes (``tool_calls`` in messages and in stream deltas, ``finish_reason: "tool_calls"``)."""

import json

import openai
import pytest
from worker_test_fakes import FakeEngineClient, make_tokenizer

from worker.tool_parsers import Llama3JsonFormat, SmolLM2Format, for_template

CHAT = "/v1/chat/completions"
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
SMOL_CALL = '<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {}}]</tool_call>'


def scripted(text: str) -> FakeEngineClient:
    return FakeEngineClient(make_tokenizer().encode(text, add_special_tokens=False) + [2], max_model_len=4096)


def prompt_text(engine) -> str:
    (ids, _), = engine.requests.values()
    return make_tokenizer().decode(ids)


def test_parsers():
    smol, llama = SmolLM2Format(), Llama3JsonFormat()
    assert smol.extract(SMOL_CALL) == (None, [("get_weather", '{"city": "Paris"}'), ("get_time", "{}")])
    assert smol.extract("Sunny. " + SMOL_CALL)[1] == []                 # a call must open the output
    assert smol.extract('<tool_call>[{"name": 3}]</tool_call>') == ('<tool_call>[{"name": 3}]</tool_call>', [])
    assert smol.extract("It is sunny.") == ("It is sunny.", [])
    assert smol.extract(smol.render_calls([("f", '{"a": 1}')])) == (None, [("f", '{"a": 1}')])
    two = '<|python_tag|>{"name": "f", "parameters": {"a": 1}}; {"name": "g", "parameters": {}}'
    assert llama.extract(two) == (None, [("f", '{"a": 1}'), ("g", "{}")])
    assert llama.extract('{"a": 1}') == ('{"a": 1}', [])
    assert llama.extract(llama.render_calls([("f", '{"a": 1}')])) == (None, [("f", '{"a": 1}')])
    assert smol.may_start_call(" <tool") and not smol.may_start_call("Hello")
    assert isinstance(for_template("{{ '<|python_tag|>' }}"), Llama3JsonFormat)
    assert isinstance(for_template(make_tokenizer().chat_template), SmolLM2Format)


@pytest.mark.parametrize("choice,parallel,check", [
    ("required", None, lambda s: s["minItems"] == 1 and "maxItems" not in s and len(s["items"]["anyOf"]) == 2
     and s["$defs"]["get_weather"] == WEATHER["function"]["parameters"]),
    ("required", False, lambda s: s["maxItems"] == 1),
    ({"type": "function", "function": {"name": "get_weather"}}, None, lambda s: s == WEATHER["function"]["parameters"]),
])
def test_required_and_named_are_constrained(client_for, choice, parallel, check):
    client, engine = client_for(scripted("x"))
    body = {"model": "fake-model", "messages": ASK, "tools": [WEATHER, TIME], "tool_choice": choice, "max_tokens": 4}
    if parallel is not None:
        body["parallel_tool_calls"] = parallel
    assert client.post(CHAT, json=body).status_code == 200
    (_, params), = engine.requests.values()
    assert params.structured.kind == "json" and check(json.loads(params.structured.text))


def test_required_keeps_each_tools_references():
    from jsonschema import Draft202012Validator

    from worker.tools import _required_schema

    person = {"$defs": {"p": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}},
              "type": "object", "properties": {"a": {"$ref": "#/$defs/p"}, "b": {"$ref": "#/properties/a"}},
              "required": ["a", "b"]}
    tools = [{"type": "function", "function": {"name": n, "parameters": person}} for n in ("f", "g")]
    v = Draft202012Validator(_required_schema(tools, True))
    assert v.is_valid([{"name": "f", "arguments": {"a": {"name": "x"}, "b": {"name": "y"}}}])
    assert not v.is_valid([{"name": "g", "arguments": {"a": {"name": 3}, "b": {"name": "y"}}}])
    assert not v.is_valid([{"name": "g", "arguments": {"a": {"name": "x"}, "b": {}}}])


def test_tools_and_history_reach_a_template_that_ignores_them(client_for):
    client, engine = client_for(scripted("It is 18C."))
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18C and sunny"}]
    r = client.post(CHAT, json={"model": "fake-model", "messages": history, "tools": [WEATHER], "max_tokens": 40})
    assert r.status_code == 200, r.text
    text = prompt_text(engine)
    assert "<tools>" in text and '"get_weather"' in text                        # the tools, in SmolLM2's words
    assert '<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</tool_call>' in text
    assert "<|im_start|>tool\n18C and sunny" in text
    msg = r.json()["choices"][0]
    assert msg["message"]["content"] == "It is 18C." and msg["message"]["tool_calls"] is None
    assert msg["finish_reason"] == "stop"


def test_tool_choice_none_hides_the_tools(client_for):
    client, engine = client_for(scripted(SMOL_CALL))
    r = client.post(CHAT, json={"model": "fake-model", "messages": ASK, "tools": [WEATHER], "tool_choice": "none",
                                "max_tokens": 400})
    assert "<tools>" not in prompt_text(engine)
    assert r.json()["choices"][0]["message"]["content"] == SMOL_CALL       # nothing parsed


@pytest.mark.parametrize("stream", [False, True])
def test_auto_calls_in_the_openai_shape_through_the_sdk(serve, stream):
    srv, _ = serve(scripted(SMOL_CALL))
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=30)
    kw = dict(model="fake-model", messages=ASK, tools=[WEATHER, TIME], max_tokens=400)
    if stream:
        calls, content, finish = {}, "", None
        for chunk in client.chat.completions.create(stream=True, **kw):
            d = chunk.choices[0].delta
            content += d.content or ""
            for tc in d.tool_calls or []:
                c = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                c["id"] = tc.id or c["id"]
                c["name"] += (tc.function.name or "") if tc.function else ""
                c["arguments"] += (tc.function.arguments or "") if tc.function else ""
            finish = chunk.choices[0].finish_reason or finish
        got = [(c["name"], json.loads(c["arguments"])) for _, c in sorted(calls.items())]
        assert all(c["id"].startswith("call_") for c in calls.values())
    else:
        r = client.chat.completions.create(**kw)
        msg, finish, content = r.choices[0].message, r.choices[0].finish_reason, r.choices[0].message.content or ""
        got = [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls]
        assert len({c.id for c in msg.tool_calls}) == 2
    assert got == [("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert finish == "tool_calls" and content == ""


def test_auto_prose_streams_as_content(serve):
    srv, _ = serve(scripted(" It is sunny in Paris."))
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=30)
    chunks = list(client.chat.completions.create(model="fake-model", messages=ASK, tools=[WEATHER], max_tokens=40,
                                                 stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == " It is sunny in Paris."
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert sum(1 for c in chunks if c.choices[0].delta.content) > 2          # streamed, not held back


def test_tokenize_renders_the_tools_as_chat_does(client_for):
    client, engine = client_for(scripted("ok"))
    chat = client.post(CHAT, json={"model": "fake-model", "messages": ASK, "tools": [WEATHER], "max_tokens": 2}).json()
    tok = client.post("/tokenize", json={"model": "fake-model", "messages": ASK, "tools": [WEATHER]}).json()
    plain = client.post("/tokenize", json={"model": "fake-model", "messages": ASK}).json()
    assert tok["count"] == chat["usage"]["prompt_tokens"] > plain["count"]


@pytest.mark.parametrize("stream", [False, True])
def test_required_cut_by_max_tokens_keeps_its_complete_calls(client_for, stream):
    cut = '[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_ti'
    n = len(make_tokenizer().encode(cut, add_special_tokens=False))
    client, _ = client_for(scripted(cut))
    body = {"model": "fake-model", "messages": ASK, "tools": [WEATHER, TIME], "tool_choice": "required",
            "max_tokens": n, "stream": stream}
    r = client.post(CHAT, json=body)
    assert r.status_code == 200
    if not stream:
        choice = r.json()["choices"][0]
        calls, finish = choice["message"]["tool_calls"], choice["finish_reason"]
        assert choice["message"]["content"] is None
    else:
        deltas = [json.loads(line[6:])["choices"] for line in r.text.splitlines()
                  if line.startswith("data: {")]
        deltas = [c[0] for c in deltas if c]
        calls = [d["delta"]["tool_calls"][0] for d in deltas if d["delta"].get("tool_calls")]
        calls = [{"function": {"name": calls[0]["function"]["name"], "arguments": calls[1]["function"]["arguments"]}}]
        finish = deltas[-1]["finish_reason"]
        assert not any(d["delta"].get("content") for d in deltas)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == \
        [("get_weather", {"city": "Paris"})]
    assert finish == "length"                           # cut: the client is told, the whole call is kept
