"""Stream migration of n > 1 streams with the real SmolLM2 worker: each unfinished choice resumes as a leg.

As tests/gateway/test_gateway_migration.py: a relay in front of one real reference-engine
worker fails mid-stream on cue; the gateway (jsq over the relays' reported queues) started
the stream there and resumes each unfinished choice with its own n = 1 continuation on the
sound relay. Checked: one stream ``id``, each choice's text (greedy: equal to the
uninterrupted n = 2 stream's), one role chunk per chat choice, one ``finish_reason`` per
choice, one usage chunk summed over the choices, ``[DONE]`` once at the end. A sampled
request is a valid continuation (every choice ends, usage adds up), not the same tokens.
"""

import sys
import time
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from fault_support import gateway, gateway_in_flight, request, run_requests  # noqa: E402
from test_gateway_migration import CHAT, COMPLETION, N, events, migrated_metric, procs, relay  # noqa: E402,F401

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.model]
PATHS = {"completion": ("/v1/completions", COMPLETION), "chat": ("/v1/chat/completions", CHAT)}


def per_choice(data: bytes, chat: bool, n: int = 2) -> tuple[dict, dict]:
    """-> ({index: text}, the usage), after checking the stream's shape."""
    objs = events(data)
    assert not any("error" in o for o in objs), objs[-3:]
    assert len({o["id"] for o in objs}) == 1
    texts, finishes, roles = {i: "" for i in range(n)}, {i: [] for i in range(n)}, {i: 0 for i in range(n)}
    for o in objs:
        for c in o.get("choices", []):
            assert "token_ids" not in c
            delta = c.get("delta") or {}
            texts[c["index"]] += (delta.get("content") or "") if chat else (c.get("text") or "")
            roles[c["index"]] += "role" in delta
            if c.get("finish_reason"):
                finishes[c["index"]].append(c["finish_reason"])
    assert all(len(f) == 1 for f in finishes.values()), finishes
    if chat:
        assert set(roles.values()) == {1}
    usage = [o for o in objs if o.get("usage") and not o.get("choices")]
    assert len(usage) == 1 and usage[0] is objs[-1]
    return texts, usage[0]["usage"]


@pytest.fixture(scope="module")
def expected(worker):
    out = {}
    for name, (path, body) in PATHS.items():
        r = httpx.post(worker.url + path, json={**body, "n": 2}, timeout=300)
        out[name] = per_choice(r.content, name == "chat")
    return out


def failing_then_sound(procs, worker, fail: str) -> tuple:
    first = relay(procs, worker, fail, after=12, queue=0)        # ~6 tokens of each choice, then it fails
    sound = relay(procs, worker, "none", queue=100)
    gw = gateway([first, sound], "--policy", "jsq")
    procs.append(gw)
    time.sleep(1)                                                # the scrapes have seen the queues
    return gw


@pytest.mark.parametrize("fail", ["cut", "drain"])
def test_greedy_n2_streams_resume_each_choice_and_equal_the_uninterrupted_run(procs, worker, expected, fail):
    gw = failing_then_sound(procs, worker, fail)
    for name, (path, body) in PATHS.items():
        status, data, _ = run_requests(lambda c: request(c, gw.url + path, {**body, "n": 2}))
        assert status == 200
        texts, usage = per_choice(data, name == "chat")
        assert texts == expected[name][0] and usage == expected[name][1]
        assert usage["completion_tokens"] == 2 * N
    assert migrated_metric(gw) == 4                             # two legs per stream
    assert not any(gateway_in_flight(gw).values())


def test_a_sampled_n3_stream_is_a_valid_continuation(procs, worker):
    gw = failing_then_sound(procs, worker, "cut")
    path, body = PATHS["chat"]
    status, data, _ = run_requests(lambda c: request(c, gw.url + path, {**body, "n": 3, "temperature": 1.0,
                                                                         "seed": 7}))
    texts, usage = per_choice(data, True, n=3)
    assert all(texts.values()) and usage["completion_tokens"] == 3 * N
    assert migrated_metric(gw) == 3
