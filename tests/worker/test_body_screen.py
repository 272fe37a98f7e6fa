"""``worker.body_screen``: a large body refused from a child process gets exactly the answer the
route gives it unscreened (fake engine; the child is the real ``python -m worker.body_screen``)."""

from __future__ import annotations

import json
import os
import time

import pytest

from swiftcommon.priority import BACKGROUND_NICE
from worker.body_screen import screen
from worker.request_body import model_ref
from worker.limits import RequestLimits

MODEL = "fake-model"
MSG = [{"role": "user", "content": "hi"}]
CMPL, CHAT, RESP = "/v1/completions", "/v1/chat/completions", "/v1/responses"
LIMITS = dict(max_stop_strings=3, max_tools=2)

# (path, body): refused by the count, by validation, or not refused before the handler.
CASES = [
    (CMPL, {"model": MODEL, "prompt": "x", "stop": [f"s{i}" for i in range(9)], "n": 2}),
    (CMPL, {"model": MODEL, "prompt": "x", "stop": list(range(4))}),
    (CHAT, {"model": MODEL, "messages": MSG, "tools": [{"type": "function", "function": {"name": f"f{i}"}}
                                                       for i in range(5)]}),
    (RESP, {"model": MODEL, "input": "hi", "tools": [None] * 5}),
    (CMPL, {"model": MODEL, "prompt": "x", "temperature": "hot"}),
    (CMPL, {"model": MODEL, "prompt": "x", "n": 0, "max_tokens": -1}),
    (CMPL, {"model": MODEL, "prompt": [[1, "a"]]}),
    (CMPL, {"model": MODEL, "prompt": "x", "seed": 2 ** 70}),
    (CHAT, {"model": MODEL, "messages": [{"role": "wizard", "content": "hi"}], "max_tokens": 2}),
    (CHAT, {"model": MODEL, "messages": "hi"}),
    (CHAT, {"model": MODEL, "messages": MSG, "tools": [{"type": "function", "function": {"name": "f",
                                                                                         "parameters": []}}]}),
    (CHAT, {"model": "other-model", "messages": MSG, "stop": ["a"] * 4}),
    (CHAT, {"model": "other-model", "messages": MSG}),
    (CHAT, {"model": MODEL, "messages": MSG, "structured_outputs": {"choice": [f"c{i}" for i in range(20000)]}}),
    (RESP, {"model": MODEL, "input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]}),
    (RESP, {"model": MODEL, "input": 5}),
    (CMPL, {"model": MODEL, "prompt": "hello", "max_tokens": 2}),
    (CHAT, {"model": MODEL, "messages": MSG, "max_tokens": 2}),
]
RAW = [  # bodies whose bytes matter: NaN, a lone surrogate, bad JSON, not an object
    (CMPL, b'{"model": "fake-model", "prompt": "x", "temperature": NaN}'),
    (CMPL, b'{"model": "fake-model", "prompt": "\\ud800"}'),
    (CMPL, b'{"model": "fake-model", "prompt": "x", "stop": ['),
    (CHAT, b'[1, 2]'),
]


def _answers(client, bodies):
    out = []
    for path, raw in bodies:
        r = client.post(path, content=raw, headers={"content-type": "application/json"})
        out.append((r.status_code, r.json() if r.status_code >= 400 else None))     # answers: ids differ
    return out


def test_screened_bodies_get_the_routes_own_answers(client_for):
    bodies = [(p, json.dumps(b).encode()) for p, b in CASES] + RAW
    plain, _ = client_for(limits=RequestLimits(**LIMITS, screen_body_bytes=0))
    screened, _ = client_for(limits=RequestLimits(**LIMITS, screen_body_bytes=1))
    scr = screened.app.state.serving.screen
    screened.post(CMPL, json={"model": MODEL, "prompt": "x", "max_tokens": 1})     # starts the child
    deadline = time.monotonic() + 60
    while not scr._child.running:
        assert time.monotonic() < deadline, ("the screen child did not start", scr._child.starting)
        time.sleep(0.05)
    if hasattr(os, "getpriority"):                  # started at background priority (swiftcommon.priority)
        assert os.getpriority(os.PRIO_PROCESS, scr._child.proc.pid) >= BACKGROUND_NICE
    expected, got = _answers(plain, bodies), _answers(screened, bodies)
    for (path, raw), e, g in zip(bodies, expected, got):
        assert g == e, (path, raw[:120])
    assert scr.screened == len(bodies)
    assert scr.refused >= 15            # most answers above came from the child, not from the route
    assert plain.app.state.serving.screen.screened == 0


def test_screen_in_process_matches_the_counts_and_models():
    from worker.api.chat.protocol import ChatCompletionRequest
    from worker.api.completions.protocol import CompletionRequest

    limits = {"limits": RequestLimits(**LIMITS), "model_names": [MODEL], "max_logprobs": 20}
    err = screen(model_ref(CompletionRequest), json.dumps(CASES[0][1]).encode(), limits)
    assert (err.status, err.param, err.message) == (400, "stop", "9 stop strings; this server takes at most 3 "
                                                                  "(--max-stop-strings).")
    err = screen(model_ref(ChatCompletionRequest), json.dumps(CASES[9][1]).encode(), limits)
    assert err.status == 400 and err.param == "messages"
    assert screen(model_ref(ChatCompletionRequest), json.dumps(CASES[17][1]).encode(), limits) is None
    assert screen(model_ref(ChatCompletionRequest), b"[1]", limits) is None          # the route's answer
    assert screen(model_ref(ChatCompletionRequest), b'{"a": ', limits) is None
    err = screen(model_ref(ChatCompletionRequest), json.dumps(CASES[12][1]).encode(), limits)
    assert (err.status, err.code) == (404, "model_not_found")
    err = screen(model_ref(ChatCompletionRequest), json.dumps(CASES[13][1]).encode(), limits)
    assert (err.status, err.param) == (400, "structured_outputs")


@pytest.mark.parametrize("value", ["-1", "x"])
def test_the_flag_takes_zero_and_refuses_negatives(value):
    import argparse

    from worker.limits import add_limit_flags, limits_from_args

    ap = argparse.ArgumentParser()
    add_limit_flags(ap)
    assert limits_from_args(ap.parse_args(["--screen-body-bytes", "0"]), ap).screen_body_bytes == 0
    with pytest.raises(SystemExit):
        limits_from_args(ap.parse_args(["--screen-body-bytes", value]), ap)
