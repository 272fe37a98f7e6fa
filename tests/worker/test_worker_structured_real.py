"""Structured outputs and tool calling with the official openai SDK, through the gateway, on the
real reference engine (SmolLM2-135M-Instruct).

One worker behind one gateway process, shared by the module. Every constrained output must
parse and validate, whatever the small model would have said unconstrained."""

import json
import re

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field
from worker_test_fakes import real_stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.model]


class City(BaseModel):
    name: str = Field(max_length=30)
    country: str = Field(max_length=30)
    population: int = Field(ge=0)
    coastal: bool


SCHEMA = {"type": "object", "additionalProperties": False, "required": ["title", "year", "genres"],
          "properties": {"title": {"type": "string", "maxLength": 40}, "year": {"type": "integer", "minimum": 1900,
                                                                                 "maximum": 2030},
                         "genres": {"type": "array", "items": {"enum": ["drama", "comedy", "horror"]},
                                    "minItems": 1, "maxItems": 2}}}
RF = {"type": "json_schema", "json_schema": {"name": "movie", "schema": SCHEMA, "strict": True}}


@pytest.fixture(scope="module")
def url(smollm2_dir):
    from refengine.config import EngineConfig

    ec = EngineConfig(model=str(smollm2_dir), max_model_len=2048, num_kv_blocks=512, max_num_seqs=8)
    with real_stack(smollm2_dir, ec) as u:
        yield u


@pytest.fixture
def sdk(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)


def ask(text):
    return [{"role": "user", "content": text}]


def test_parse_with_a_pydantic_model(sdk):
    r = sdk.chat.completions.parse(model="smol", messages=ask("Describe a city as JSON."), response_format=City,
                                   max_tokens=120, temperature=0)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(msg.parsed, City), msg.content
    assert City.model_validate_json(msg.content) == msg.parsed


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_streamed_and_not(sdk, stream):
    kw = dict(model="smol", messages=ask("Give me a movie as JSON."), response_format=RF, max_tokens=120,
              temperature=0.8, seed=5)
    if stream:
        text, finish = "", None
        for chunk in sdk.chat.completions.create(stream=True, **kw):
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
    else:
        r = sdk.chat.completions.create(**kw)
        text, finish = r.choices[0].message.content, r.choices[0].finish_reason
    assert finish == "stop"
    jsonschema.validate(json.loads(text), SCHEMA)


@pytest.mark.parametrize("stream", [False, True])
def test_completions_structured_outputs_choice_and_regex(sdk, stream):
    for extra, ok in (({"structured_outputs": {"choice": ["yes", "no"]}}, lambda s: s in ("yes", "no")),
                      ({"guided_regex": r"\d{4}-\d{2}-\d{2}"}, lambda s: re.fullmatch(r"\d{4}-\d{2}-\d{2}", s))):
        kw = dict(model="smol", prompt="Is the sky blue? Answer:", max_tokens=20, temperature=1.0, extra_body=extra)
        if stream:
            text = "".join(c.choices[0].text for c in sdk.completions.create(stream=True, **kw) if c.choices)
        else:
            text = sdk.completions.create(**kw).choices[0].text
        assert ok(text), (extra, text)


def test_unsupported_schema_is_a_400_naming_the_feature(sdk):
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "array", "items": {"type": "string"}, "uniqueItems": True}}}
    with pytest.raises(openai.BadRequestError) as e:
        sdk.chat.completions.create(model="smol", messages=ask("hi"), response_format=bad, max_tokens=8)
    assert "uniqueItems" in str(e.value)


def test_schema_too_long_for_max_tokens_ends_with_length(sdk):
    r = sdk.chat.completions.create(model="smol", messages=ask("A movie?"), response_format=RF, max_tokens=5)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 5


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
                   "properties": {"city": {"type": "string", "maxLength": 30},
                                  "unit": {"enum": ["celsius", "fahrenheit"]}}}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a time zone",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["zone"],
                   "properties": {"zone": {"type": "string", "maxLength": 20}}}}}
TOOLS = {t["function"]["name"]: t for t in (WEATHER, TIME)}


def valid_calls(calls):
    for c in calls:
        assert c.type == "function" and c.id.startswith("call_")
        jsonschema.validate(json.loads(c.function.arguments), TOOLS[c.function.name]["function"]["parameters"])
    return [c.function.name for c in calls]


@pytest.mark.parametrize("choice,parallel", [("required", True), ("required", False),
                                             ({"type": "function", "function": {"name": "get_time"}}, True)])
def test_required_and_named_tool_calls_validate(sdk, choice, parallel):
    r = sdk.chat.completions.create(model="smol", messages=ask("What is the weather in Paris and the time in Tokyo?"),
                                    tools=[WEATHER, TIME], tool_choice=choice, parallel_tool_calls=parallel,
                                    max_tokens=150, temperature=0.7, seed=11)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    names = valid_calls(c.message.tool_calls)
    assert names
    if not parallel:
        assert len(names) == 1
    if isinstance(choice, dict):
        assert names == ["get_time"]


def test_streamed_required_tool_calls(sdk):
    calls, finish = {}, None
    for chunk in sdk.chat.completions.create(model="smol", messages=ask("Weather in Oslo?"), tools=[WEATHER],
                                             tool_choice="required", max_tokens=100, temperature=0, stream=True):
        if not chunk.choices:
            continue
        for tc in chunk.choices[0].delta.tool_calls or []:
            c = calls.setdefault(tc.index, {"name": "", "arguments": ""})
            c["name"] += tc.function.name or ""
            c["arguments"] += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and calls
    for c in calls.values():
        assert c["name"] == "get_weather"
        jsonschema.validate(json.loads(c["arguments"]), WEATHER["function"]["parameters"])


def test_tool_result_round_trip(sdk):
    msgs = ask("What is the weather in Paris?")
    first = sdk.chat.completions.create(model="smol", messages=msgs, tools=[WEATHER], tool_choice="required",
                                        parallel_tool_calls=False, max_tokens=100, temperature=0)
    call = first.choices[0].message.tool_calls[0]
    msgs += [first.choices[0].message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"}]
    second = sdk.chat.completions.create(model="smol", messages=msgs, tools=[WEATHER], max_tokens=40, temperature=0)
    c = second.choices[0]
    assert c.finish_reason in ("stop", "length", "tool_calls")
    if c.finish_reason == "tool_calls":                 # auto: the small model may call again; then it parses
        valid_calls(c.message.tool_calls)
    else:
        assert c.message.content
    # The history reached the model: the same conversation without the tool result gives another prompt.
    n_with = second.usage.prompt_tokens
    without = sdk.chat.completions.create(model="smol", messages=msgs[:-1], tools=[WEATHER], max_tokens=1)
    assert n_with > without.usage.prompt_tokens


def test_responses_parse_and_function_tools(sdk):
    r = sdk.responses.parse(model="smol", input="Describe a city as JSON.", text_format=City, max_output_tokens=120,
                            temperature=0)
    assert r.status == "completed" and isinstance(r.output_parsed, City), r.output_text
    tool = {"type": "function", **WEATHER["function"]}
    r = sdk.responses.create(model="smol", input="What is the weather in Paris?", tools=[tool], tool_choice="required",
                             parallel_tool_calls=False, max_output_tokens=100, temperature=0)
    (call,) = [o for o in r.output if o.type == "function_call"]
    assert call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER["function"]["parameters"])
    follow = [{"role": "user", "content": "What is the weather in Paris?"},
              {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
              {"type": "function_call_output", "call_id": call.call_id, "output": "18 degrees and sunny"}]
    again = sdk.responses.create(model="smol", input=follow, tools=[tool], max_output_tokens=30, temperature=0)
    assert again.status in ("completed", "incomplete") and again.usage.input_tokens > r.usage.input_tokens
