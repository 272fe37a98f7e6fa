"""Stream migration of constrained streams (structured outputs, tools) with the real SmolLM2 worker.

As tests/gateway/test_gateway_migration.py: relays in front of one real reference-engine
worker fail mid-stream on cue, and the stream resumes on the other relay. The resuming
worker advances the grammar through the continuation and replays the tool-call holding
(worker.continuation), so what the client gets of a greedy request (content, tool calls'
names and arguments, finish reasons, usage) equals the uninterrupted stream, with one
stream ``id`` and one id per tool call. A worker that refuses the continuation (400, as a
vLLM worker does a constrained one) is passed over for another, and with none left the
stream ends with the explicit error.
"""

import json
import sys
import time
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from fault_support import gateway, gateway_in_flight, request, run_requests  # noqa: E402
from test_gateway_migration import events, migrated_metric, procs, relay  # noqa: E402,F401 - fixtures

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.model]
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather in a city",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
                   "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["c", "f"]}}}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Get the time in a city",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                   "properties": {"city": {"type": "string", "maxLength": 12}}}}}
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "city"],
          "properties": {"name": {"type": "string", "maxLength": 16}, "age": {"type": "integer"},
                         "city": {"type": "string", "maxLength": 16}}}


def chat(content: str, max_tokens: int, **extra) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}, **extra}


CASES = {
    "json_schema": (CHAT, chat("Describe a person as JSON.", 40, response_format={
        "type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}})),
    "guided_json": (COMPLETIONS, {"model": "m", "prompt": "A person as JSON:", "max_tokens": 40, "temperature": 0,
                                  "stream": True, "stream_options": {"include_usage": True}, "guided_json": PERSON}),
    "required": (CHAT, chat("Get the weather in Paris.", 60, tools=[WEATHER, TIME], tool_choice="required",
                            parallel_tool_calls=False)),
    "named": (CHAT, chat("Get the weather in Paris.", 60, tools=[WEATHER, TIME],
                         tool_choice={"type": "function", "function": {"name": "get_weather"}})),
    "parallel": (CHAT, chat("Get the weather in Paris and in Rome.", 80, tools=[WEATHER], tool_choice="required")),
    "auto": (CHAT, chat("Get the weather in Paris.", 30, tools=[WEATHER, TIME])),
}


def seen(data: bytes, chat_stream: bool) -> dict:
    """What a client makes of a stream: text, tool calls (index -> id, name, arguments), finishes, usage."""
    objs = events(data)
    assert not any("error" in o for o in objs), objs[-3:]
    assert len({o["id"] for o in objs}) == 1
    text, calls, finishes = "", {}, []
    for o in objs:
        for c in o.get("choices", []):
            assert "token_ids" not in c
            delta = c.get("delta") or {}
            text += (delta.get("content") or "") if chat_stream else (c.get("text") or "")
            for tc in delta.get("tool_calls") or ():
                call = calls.setdefault(tc["index"], {"ids": [], "name": "", "arguments": ""})
                if "id" in tc:
                    call["ids"].append(tc["id"])
                call["name"] += tc.get("function", {}).get("name") or ""
                call["arguments"] += tc.get("function", {}).get("arguments") or ""
            if c.get("finish_reason"):
                finishes.append(c["finish_reason"])
    if chat_stream:
        assert sum("role" in (c.get("delta") or {}) for o in objs for c in o.get("choices", [])) == 1
    for call in calls.values():             # each call has one id, the one its first delta gave
        assert len(call["ids"]) == 1 and call["ids"][0].startswith("call_")
    ids = [c.pop("ids")[0] for c in calls.values()]
    assert len(set(ids)) == len(ids)
    return {"text": text, "calls": calls, "finishes": finishes, "usage": objs[-1]["usage"]}


@pytest.fixture(scope="module")
def expected(worker):
    """The uninterrupted greedy streams of every case, straight from the worker."""
    out = {}
    for name, (path, body) in CASES.items():
        r = httpx.post(worker.url + path, json=body, timeout=300)
        assert r.status_code == 200, r.text
        out[name] = seen(r.content, path == CHAT)
    return out


def test_the_cases_exercise_what_they_name(expected):
    assert json.loads(expected["json_schema"]["text"]) and json.loads(expected["guided_json"]["text"])
    for name in ("required", "named"):
        (call,) = expected[name]["calls"].values()
        assert call["name"] == "get_weather" and json.loads(call["arguments"])["city"]
        assert expected[name]["finishes"] == ["tool_calls"] and expected[name]["text"] == ""
    assert len(expected["parallel"]["calls"]) >= 2, expected["parallel"]
    assert expected["auto"]["text"] and not expected["auto"]["calls"]     # prose: released from the holding


@pytest.mark.parametrize("fail", ["cut", "drain"])
def test_constrained_greedy_streams_migrated_mid_stream_equal_the_uninterrupted_ones(procs, worker, expected, fail):
    gw = gateway([relay(procs, worker, fail, after=5), relay(procs, worker, fail, after=5)])
    procs.append(gw)
    for name, (path, body) in CASES.items():
        status, data, _ = run_requests(lambda c: request(c, gw.url + path, body))
        assert status == 200
        assert seen(data, path == CHAT) == expected[name], name
    assert migrated_metric(gw) == len(CASES)
    assert not any(gateway_in_flight(gw).values())


def test_parallel_calls_cut_inside_the_second_call(procs, worker, expected):
    gw = gateway([relay(procs, worker, "cut", after=30), relay(procs, worker, "cut", after=30)])
    procs.append(gw)
    path, body = CASES["parallel"]
    status, data, _ = run_requests(lambda c: request(c, gw.url + path, body))
    assert seen(data, True) == expected["parallel"] and migrated_metric(gw) == 1


def test_a_worker_that_refuses_the_continuation_is_passed_over(procs, worker, expected):
    # jsq by the relays' reported queues: the stream starts on `cut`, `refuse` answers the continuation with
    # a 400 (a vLLM worker), `sound` resumes it
    cut, refuse = relay(procs, worker, "cut", after=5, queue=0), relay(procs, worker, "refuse", queue=50)
    sound = relay(procs, worker, "none", queue=100)
    gw = gateway([cut, refuse, sound], "--policy", "jsq")
    procs.append(gw)
    time.sleep(1)                                   # the scrapes have seen the queues
    path, body = CASES["required"]
    status, data, _ = run_requests(lambda c: request(c, gw.url + path, body))
    assert seen(data, True) == expected["required"]
    assert migrated_metric(gw) == 1


def test_with_only_refusing_workers_left_the_stream_ends_with_the_explicit_error(procs, worker):
    cut, refuse = relay(procs, worker, "cut", after=5, queue=0), relay(procs, worker, "refuse", queue=50)
    gw = gateway([cut, refuse], "--policy", "jsq")
    procs.append(gw)
    time.sleep(1)
    path, body = CASES["json_schema"]
    status, data, _ = run_requests(lambda c: request(c, gw.url + path, body))
    objs = events(data)
    assert status == 200 and "error" in objs[-1] and "HTTP 400" in objs[-1]["error"]["message"]
