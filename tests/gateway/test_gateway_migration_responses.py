"""Stream migration of ``/v1/responses`` streams (gateway.migration.responses) with processes (the
tracker alone: tests/gateway/test_gateway_migration_rules.py).

As tests/gateway/test_gateway_migration.py, relays in front of one real SmolLM2 worker cut the
stream mid-way and it resumes on the other relay; what the client gets of a greedy request
(the text deltas, the closing events, the function calls, the terminal response) equals
the uninterrupted stream, with sequence numbers 0, 1, 2, ... and one id per response and item.
"""

import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from fault_support import gateway, gateway_in_flight, request, run_requests  # noqa: E402
from test_gateway_migration import migrated_metric, procs, relay  # noqa: E402,F401 - fixtures
from test_gateway_migration_constrained import WEATHER  # noqa: E402
from test_gateway_migration_rules import responses_events as parsed  # noqa: E402

pytestmark = pytest.mark.e2e


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
