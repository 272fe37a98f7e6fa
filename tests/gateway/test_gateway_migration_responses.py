"""Stream migration of ``/v1/responses`` streams (gateway.migration.responses), with and without processes.

Unit: the tracker keeps one response id, one message item id and one ``sequence_number``
count across workers, strips the ids it asked for, migrates on a retryable
``response.failed`` and ends the stream at the terminal event. Real: as
tests/gateway/test_gateway_migration.py, relays in front of one real SmolLM2 worker cut the
stream mid-way and it resumes on the other relay; what the client gets of a greedy request
(the text deltas, the closing events, the function calls, the terminal response) equals
the uninterrupted stream, with sequence numbers 0, 1, 2, ... and one id per response and item.
"""

import json
import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from fault_support import gateway, gateway_in_flight, request, run_requests  # noqa: E402
from test_gateway_migration import migrated_metric, procs, relay, worker  # noqa: E402,F401 - fixtures
from test_gateway_migration_constrained import WEATHER  # noqa: E402

from gateway.migration import ResponsesTracker, rewrite  # noqa: E402

pytestmark = pytest.mark.e2e


def sse(kind: str, **data) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()


def parsed(out: bytes) -> list:
    blocks = [b.split("\n") for b in out.decode().split("\n\n") if b]
    assert all(b[0] == "event: " + json.loads(b[1][6:])["type"] for b in blocks)       # event names kept
    return [json.loads(b[1][6:]) for b in blocks]


def test_the_tracker_keeps_one_response_and_one_sequence_across_workers():
    t = ResponsesTracker({"input": "x", "stream": True}, max_migrations=2)
    first = (sse("response.created", sequence_number=0, response={"id": "resp_a", "created_at": 1, "output": []})
             + sse("response.output_item.added", sequence_number=1, item={"type": "message", "id": "msg_a"})
             + sse("response.output_text.delta", sequence_number=2, item_id="msg_a", delta="He", token_ids=[1, 2])
             + sse("swiftserve.token_ids", token_ids=[3]))
    out, migrate, ended = rewrite(t, first)
    assert [e["type"] for e in parsed(out)] == ["response.created", "response.output_item.added",
                                                "response.output_text.delta"]
    assert "token_ids" not in parsed(out)[2] and t.token_ids == [1, 2, 3] and t.can_migrate() and not ended
    out, migrate, _ = rewrite(t, sse("response.failed", sequence_number=3, response={"error": {
        "code": "shutting_down", "message": "drained"}}))
    assert out == b"" and migrate.reason == "worker_error"
    t.migrations = 1
    body, n = t.resume()
    assert n == 3 and json.loads(body)["continuation_token_ids"] == [1, 2, 3]
    rest = (sse("response.output_text.delta", sequence_number=0, item_id="msg_b", delta="llo", token_ids=[4])
            + sse("swiftserve.token_ids", token_ids=[5], finish_reason="stop")
            + sse("response.output_text.done", sequence_number=1, item_id="msg_b", text="Hello")
            + sse("response.completed", sequence_number=2, response={
                "id": "resp_b", "created_at": 2, "output": [{"type": "message", "id": "msg_b"}]}))
    out, _, ended = rewrite(t, rest)
    events = parsed(out)
    assert ended and [e["sequence_number"] for e in events] == [3, 4, 5]
    assert {e.get("item_id") for e in events[:2]} == {"msg_a"}
    assert events[-1]["response"]["id"] == "resp_a" and events[-1]["response"]["output"][0]["id"] == "msg_a"
    assert not t.can_migrate()


def test_a_responses_stream_past_its_generation_or_without_ids_does_not_move():
    t = ResponsesTracker({"input": "x", "stream": True}, max_migrations=2)
    rewrite(t, sse("swiftserve.token_ids", token_ids=[5], finish_reason="stop"))
    assert not t.can_migrate()                  # only the closing burst was left
    t = ResponsesTracker({"input": "x", "stream": True}, max_migrations=2)
    rewrite(t, sse("response.output_text.delta", sequence_number=0, item_id="m", delta="x"))
    assert not t.can_migrate()
    assert ResponsesTracker.for_request("/v1/responses", {"input": "x"}, 2) is None       # not streamed


CASES = {
    "text": {"model": "m", "input": "Tell me about the sea in three sentences.", "max_output_tokens": 32,
             "temperature": 0, "stream": True},
    "tools": {"model": "m", "input": "Get the weather in Paris.", "max_output_tokens": 60, "temperature": 0,
              "stream": True, "tool_choice": "required",
              "tools": [{"type": "function", **WEATHER["function"]}]},
}


def seen(data: bytes) -> dict:
    """A Responses stream as a client keeps it; ids checked for sameness and replaced by their order."""
    events = parsed(data)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["type"] in ("response.completed", "response.incomplete"), events[-1]
    assert not any(e["type"] == "swiftserve.token_ids" or "token_ids" in e for e in events)
    assert len({e["response"]["id"] for e in events if "response" in e}) == 1
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    done = [e["text"] for e in events if e["type"] == "response.output_text.done"]
    calls = [(e["item"]["name"], e["item"]["arguments"]) for e in events
             if e["type"] == "response.output_item.done" and e["item"]["type"] == "function_call"]
    final = events[-1]["response"]
    msg_ids = {e.get("item_id") for e in events if str(e.get("item_id", "")).startswith("msg")}
    assert len(msg_ids) <= 1
    return {"types": [e["type"] for e in events], "text": text, "done": done, "calls": calls,
            "usage": final["usage"], "status": final["status"],
            "output": [o.get("content") or (o["name"], o["arguments"]) for o in final["output"]]}


@pytest.fixture(scope="module")
def expected(worker):
    out = {}
    for name, body in CASES.items():
        r = httpx.post(worker.url + "/v1/responses", json=body, timeout=300)
        assert r.status_code == 200, r.text
        out[name] = seen(r.content)
    return out


@pytest.mark.slow
@pytest.mark.model
def test_greedy_responses_streams_migrated_mid_stream_equal_the_uninterrupted_ones(procs, worker, expected):
    assert expected["text"]["text"] and expected["tools"]["calls"][0][0] == "get_weather"
    gw = gateway([relay(procs, worker, "cut", after=6), relay(procs, worker, "cut", after=6)])
    procs.append(gw)
    for name, body in CASES.items():
        status, data, _ = run_requests(lambda c: request(c, gw.url + "/v1/responses", body))
        assert status == 200
        assert seen(data) == expected[name], name
    assert migrated_metric(gw) == len(CASES)
    assert not any(gateway_in_flight(gw).values())
