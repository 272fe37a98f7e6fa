"""/v1/responses, /tokenize and /detokenize with the fake engine and the tiny tokenizer:
shapes the official SDK parses, the streaming event sequence, what is refused and why."""

import json

import openai
import pytest
from worker_test_fakes import FakeEngineClient, make_tokenizer

REPLY = " Hello world, this is a test."


def sse_events(text: str) -> list[tuple[str, dict]]:
    """(event name, data) per SSE event; every event has both lines and data is JSON."""
    out = []
    assert text.endswith("\n\n")
    for block in text[:-2].split("\n\n"):
        name, data = block.split("\n")
        assert name.startswith("event: ") and data.startswith("data: ")
        out.append((name[7:], json.loads(data[6:])))
    return out


def test_response_object_and_chat_equivalence(client_for):
    client, engine = client_for()
    r = client.post("/v1/responses", json={"model": "fake-model", "input": "hi", "instructions": "Be brief.",
                                           "max_output_tokens": 4, "metadata": {"k": "v"}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "response" and body["id"].startswith("resp-") and body["store"] is False
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}
    (item,) = body["output"]
    assert item["type"] == "message" and item["role"] == "assistant"
    text = make_tokenizer().decode(make_tokenizer().encode(REPLY, add_special_tokens=False)[:4])
    assert item["content"] == [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    (prompt, params), = engine.requests.values()
    chat = client.post("/v1/chat/completions", json={"model": "fake-model", "max_tokens": 4, "messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]}).json()
    assert list(engine.requests.values())[1][0] == prompt                     # the same rendered prompt
    assert body["usage"]["input_tokens"] == chat["usage"]["prompt_tokens"] == len(prompt)
    assert body["usage"]["output_tokens"] == 4 and body["metadata"] == {"k": "v"}
    assert params.max_tokens == 4 and params.temperature == 1.0


def test_message_items_and_roles(client_for):
    client, engine = client_for()
    items = [{"role": "developer", "content": "Rules."},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"},
                                                              {"type": "input_text", "text": "b"}]},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "c"}]},
             {"role": "user", "content": "d"}]
    assert client.post("/v1/responses", json={"model": "fake-model", "input": items}).status_code == 200
    (prompt, _), = engine.requests.values()
    rendered = make_tokenizer().decode(prompt)
    assert "<|im_start|>system\nRules.<|im_end|>" in rendered and "a\nb" in rendered
    assert "<|im_start|>assistant\nc<|im_end|>" in rendered and rendered.endswith("<|im_start|>assistant\n")


def test_streaming_event_sequence(client_for):
    script = make_tokenizer().encode(" Hi there<|im_end|>")
    client, _ = client_for(FakeEngineClient(script))
    r = client.post("/v1/responses", json={"model": "fake-model", "input": "hi", "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    names = [n for n, _ in events]
    assert names[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert names[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert all(d["type"] == n for n, d in events) and [d["sequence_number"] for _, d in events] == list(
        range(len(events)))
    deltas = "".join(d["delta"] for n, d in events if n == "response.output_text.delta")
    assert deltas == " Hi there" == events[-1][1]["response"]["output"][0]["content"][0]["text"]
    assert events[0][1]["response"]["status"] == "in_progress" and events[0][1]["response"]["usage"] is None
    assert events[-1][1]["response"]["usage"]["output_tokens"] == len(script)         # EOS counted, as in chat


def test_engine_failure_mid_stream_is_response_failed(client_for):
    client, _ = client_for(FakeEngineClient(fail_after=2))
    events = sse_events(client.post("/v1/responses", json={"model": "fake-model", "input": "hi",
                                                           "stream": True}).text)
    assert events[-1][0] == "response.failed" and events[-1][1]["response"]["error"]["message"]


@pytest.mark.parametrize("extra, param", [
    ({"store": True}, "store"),
    ({"previous_response_id": "resp-1"}, "previous_response_id"),
    ({"text": {"format": {"type": "xml"}}}, "text.format"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object", "uniqueItems": 3}}}},
     "text.format"),
    ({"tools": [{"type": "web_search"}]}, "tools.0"),
    ({"tools": [{"type": "function", "name": "bad name"}]}, "tools.0.name"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"max_tool_calls": 1}, "max_tool_calls"),
    ({"reasoning": {"effort": "low"}}, "reasoning"),
    ({"background": True}, "background"),
    ({"truncation": "auto"}, "truncation"),
    ({"include": ["message.output_text.logprobs"]}, "include"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"max_output_tokens": 10**6}, "max_output_tokens"),
    ({"temperature": 3}, "temperature"),
    ({"input": []}, "input"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input.0"),
    ({"input": [{"type": "function_call_output", "output": "y"}]}, "input.0"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]}, "input.0"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input.0.role"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input.0.content.0"),
])
def test_refused_with_a_named_parameter(client, extra, param):
    body = {"model": "fake-model", "input": "hi", **extra}
    r = client.post("/v1/responses", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_sdk_parses_responses(serve):
    srv, _ = serve(FakeEngineClient(make_tokenizer().encode(" Hi there<|im_end|>")))
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=30)
    r = client.responses.create(model="fake-model", input="hi", max_output_tokens=2, store=False)
    assert r.output_text and r.usage.output_tokens == 2 and r.status == "incomplete"
    events = list(client.responses.create(model="fake-model", input="hi", max_output_tokens=2, stream=True))
    assert events[-1].type == "response.incomplete" and events[-1].response.output_text == r.output_text
    with client.responses.stream(model="fake-model", input="hi") as stream:      # the SDK's helper
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == " Hi there" and final.status == "completed"
    client.close()


def test_tokenize_and_detokenize(client):
    tok = make_tokenizer()
    t = client.post("/tokenize", json={"prompt": "Hello world", "return_token_strs": True}).json()
    assert t["tokens"] == tok.encode("Hello world") and t["count"] == len(t["tokens"])
    assert t["token_strs"] == tok.convert_ids_to_tokens(t["tokens"]) and t["max_model_len"] == 256
    msgs = [{"role": "user", "content": "hi"}]
    c = client.post("/tokenize", json={"model": "fake-model", "messages": msgs, "add_generation_prompt": False}).json()
    assert tok.decode(c["tokens"]).endswith("<|im_start|>user\nhi<|im_end|>\n") and c["token_strs"] is None
    d = client.post("/detokenize", json={"tokens": t["tokens"]}).json()
    assert d == {"prompt": "Hello world"}
    for path, body, param in (("/tokenize", {}, None), ("/tokenize", {"prompt": "x", "messages": msgs}, None),
                              ("/tokenize", {"prompt": "x", "model": "other"}, "model"),
                              ("/detokenize", {"tokens": [10**6]}, "tokens"), ("/detokenize", {}, "tokens"),
                              ("/tokenize", {"messages": msgs, "chat_template": "{{ 'x' }}"}, "chat_template")):
        r = client.post(path, json=body)
        assert r.status_code in (400, 404) and r.json()["error"]["param"] == param, (path, body, r.text)


WEATHER = {"type": "function", "name": "get_weather", "description": "Weather of a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CALL = '[{"name": "get_weather", "arguments": {"city": "Paris"}}]'


def scripted(text: str) -> FakeEngineClient:
    return FakeEngineClient(make_tokenizer().encode(text, add_special_tokens=False) + [2], max_model_len=4096)


def test_text_format_is_the_chat_response_format(client_for):
    client, engine = client_for(scripted('{"city": "Paris"}'))
    fmt = {"type": "json_schema", "name": "place", "schema": WEATHER["parameters"], "strict": True}
    body = client.post("/v1/responses", json={"model": "fake-model", "input": "hi", "text": {"format": fmt}}).json()
    (_, params), = engine.requests.values()
    assert params.structured.kind == "json" and json.loads(params.structured.text) == WEATHER["parameters"]
    assert body["text"] == {"format": fmt} and body["output"][0]["content"][0]["text"] == '{"city": "Paris"}'


@pytest.mark.parametrize("stream", [False, True])
def test_required_tool_calls_are_function_call_items(client_for, stream):
    client, engine = client_for(scripted(CALL))
    r = client.post("/v1/responses", json={"model": "fake-model", "input": "Weather in Paris?", "tools": [WEATHER],
                                           "tool_choice": "required", "stream": stream})
    assert r.status_code == 200, r.text
    (_, params), = engine.requests.values()
    assert params.structured.kind == "json"                       # enforced by the grammar, as on chat
    if stream:
        events = sse_events(r.text)
        names = [n for n, _ in events]
        assert names[2:] == ["response.output_item.added", "response.function_call_arguments.delta",
                             "response.function_call_arguments.done", "response.output_item.done",
                             "response.completed"]
        assert events[2][1]["item"]["arguments"] == "" and events[3][1]["delta"] == '{"city": "Paris"}'
        body = events[-1][1]["response"]
    else:
        body = r.json()
    (item,) = body["output"]
    assert item["type"] == "function_call" and item["name"] == "get_weather" and item["status"] == "completed"
    assert json.loads(item["arguments"]) == {"city": "Paris"} and item["call_id"].startswith("call_")
    assert body["status"] == "completed" and body["tools"] == [WEATHER]


def test_function_call_history_reaches_the_prompt(client_for):
    client, engine = client_for(FakeEngineClient(max_model_len=4096))
    items = [{"role": "user", "content": "Weather in Paris?"},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
             {"type": "function_call_output", "call_id": "call_1", "output": "sunny, 21 C"}]
    r = client.post("/v1/responses", json={"model": "fake-model", "input": items, "tools": [WEATHER]})
    assert r.status_code == 200, r.text
    (prompt, _), = engine.requests.values()
    rendered = make_tokenizer().decode(prompt)
    assert '"city": "Paris"' in rendered and "sunny, 21 C" in rendered and "get_weather" in rendered


def test_sdk_responses_parse_and_tools(serve):
    from pydantic import BaseModel

    class Place(BaseModel):
        city: str

    srv, engine = serve(scripted('{"city": "Paris"}'))
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=30)
    r = client.responses.parse(model="fake-model", input="Where?", text_format=Place)
    assert r.output_parsed == Place(city="Paris")
    srv2, _ = serve(scripted(CALL))
    client2 = openai.OpenAI(base_url=srv2.url + "/v1", api_key="unused", max_retries=0, timeout=30)
    r = client2.responses.create(model="fake-model", input="Weather?", tools=[WEATHER], tool_choice="required")
    (call,) = [o for o in r.output if o.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    client.close()
    client2.close()


def _resuming(text: str) -> FakeEngineClient:
    """A scripted reply that resumes after whatever part of it ends the prompt (like a greedy model)."""
    reply = make_tokenizer().encode(text, add_special_tokens=False)

    def script(prompt, _params):
        k = next((k for k in range(len(reply), 0, -1) if prompt[-k:] == reply[:k]), 0)
        return reply[k:] + [2]
    return FakeEngineClient(script, max_model_len=4096)


@pytest.mark.parametrize("text,tools", [(REPLY, None), (CALL, "required")])
def test_a_stream_resumed_after_any_event_joins_into_the_uninterrupted_one(client_for, text, tools):
    client, _ = client_for(_resuming(text))
    body = {"input": "Hi", "stream": True, "return_token_ids": True, "max_output_tokens": 60}
    if tools:
        body |= {"tools": [{"type": "function", **WEATHER}], "tool_choice": tools}
    full = sse_events(client.post("/v1/responses", json=body).text)

    def view(events):       # what a client keeps: text deltas, the closing events, the final response's output
        return ("".join(d["delta"] for k, d in events if k == "response.output_text.delta"),
                [k for k, _ in events if k != "swiftserve.token_ids"][-4:], events[-1][1]["response"]["output"],
                events[-1][1]["response"]["usage"])

    ends = next(i for i, (_, d) in enumerate(full) if d.get("finish_reason"))
    for cut in range(1, ends):
        sent = full[:cut]
        done = [t for _, d in sent for t in d.get("token_ids") or ()]
        if not done:
            continue
        r = client.post("/v1/responses", json={**body, "continuation_token_ids": done})
        assert r.headers["x-swiftserve-continuation"] == str(len(done))
        rest = sse_events(r.text)
        assert not any(k in ("response.created", "response.in_progress") for k, _ in rest)
        got, want = view(sent + rest), view(full)
        assert got[0] == want[0] and got[1] == want[1] and got[3] == want[3], cut
        strip = lambda out: [{k: v for k, v in o.items() if k not in ("id", "call_id")} for o in out]  # noqa: E731
        assert strip(got[2]) == strip(want[2])


def test_a_drain_abort_ends_a_responses_stream_as_a_resumable_failure():
    from worker.continuation import DRAIN_ABORT
    from worker.api.responses.protocol import ResponsesRequest
    from worker.api.responses.serving import ResponsesFormatter, ResponseView
    from worker.choices import ChoiceEvent

    fmt = ResponsesFormatter(ResponseView(ResponsesRequest(input="x", stream=True), "m", 3), report_ids=True)
    out = list(fmt.opening()) + list(fmt.stream_event(ChoiceEvent(0, "Hi", token_ids=[1], num_output_tokens=1)))
    out += list(fmt.stream_event(ChoiceEvent(0, "", finish_reason="abort", stop_reason=DRAIN_ABORT, token_ids=[2],
                                             num_output_tokens=2)))
    events = sse_events("".join(out) + "".join(fmt.closing()))
    assert events[-2] == ("swiftserve.token_ids", {"type": "swiftserve.token_ids", "token_ids": [2]})
    assert events[-1][0] == "response.failed" and events[-1][1]["response"]["error"]["code"] == "shutting_down"


@pytest.mark.parametrize("extra, param, named", [
    ({"input": [{"role": "user", "content": "hi"},
                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]}, "input.1", None),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {}, "strict": "yes"}}}, "text.format",
     "text.format.strict"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": "{not json"}}}, "text.format.schema",
     "text.format.schema"),
    ({"tools": [{"type": "function", "name": "f", "parameters": []}]}, "tools.0.parameters", None),
    ({"tools": [dict(WEATHER, parameters={"type": "object", "uniqueItems": 3})]}, "tools.0.parameters",
     "tools.0.parameters"),
    ({"tools": [WEATHER], "tool_choice": "required", "text": {"format": {"type": "json_object"}}}, "tool_choice",
     None),
    ({"input": "hi " * 400}, "input", None),
    ({"input": [{"role": "user", "content": "hi " * 400}]}, "input", None),
])
def test_errors_name_the_responses_own_fields(client, extra, param, named):
    """Validated as a Responses request: the parameter (and any field the message quotes) is the Responses
    API's own, never a chat field such as ``messages.0`` or ``response_format``."""
    r = client.post("/v1/responses", json={"model": "fake-model", "input": "hi", **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    assert not any(chat in err["message"] for chat in ("messages", "response_format", ".function.",
                                                         "max_completion_tokens")), err
    if named:
        assert named in err["message"], err


@pytest.mark.parametrize("stream", [False, True])
def test_the_response_is_the_typed_model(client_for, stream):
    """Every Response the endpoint returns (whole, or in the stream's events) is an instance of the typed
    output model, to the field (extra fields are refused by it)."""
    from worker.api.responses.models import FunctionCallItem, MessageItem, ResponseObject

    client, _ = client_for(scripted(CALL))
    r = client.post("/v1/responses", json={"model": "fake-model", "input": "Weather?", "tools": [WEATHER],
                                           "tool_choice": "required", "stream": stream})
    bodies = [d["response"] for _, d in sse_events(r.text) if "response" in d] if stream else [r.json()]
    for body in bodies:
        assert ResponseObject.model_validate(body).model_dump(mode="json") == body
    (item,) = ResponseObject.model_validate(bodies[-1]).output
    assert isinstance(item, FunctionCallItem) and item.name == "get_weather"
    client, _ = client_for()
    out = ResponseObject.model_validate(client.post("/v1/responses", json={"input": "hi"}).json()).output
    assert isinstance(out[0], MessageItem) and out[0].content[0].type == "output_text"
