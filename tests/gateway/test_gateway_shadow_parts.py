"""The shadow monitor's parts as pure functions: reading answers from JSON bodies and SSE chunks,
naming a request's constraint and checking an answer against it, the NLL and agreement of an
echoed logprobs block, which requests are sampled, load shedding, and ``--shadow-yield all``
(the real comparison with SmolLM2 and its SwiftKV variants: test_gateway_model_pools.py)."""

import asyncio
import json
import random
from types import SimpleNamespace

import pytest

from gateway.aliases import parse_alias_flag
from gateway.answers import AnswerTap, Constraint, constraint_of, valid
from gateway.discovery import WorkerPool
from gateway.model_routing import Routed
from gateway.pools import ModelDirectory
from gateway.shadow import ShadowMonitor, Watch, answer_nll, shadowable


def _sse(*objs) -> bytes:
    return b"".join(b"data: " + json.dumps(o).encode() + b"\n\n" for o in objs) + b"data: [DONE]\n\n"


def test_tap_reads_streams_in_any_chunking_and_bodies():
    stream = _sse({"choices": [{"index": 0, "delta": {"role": "assistant"}}]},
                  {"choices": [{"index": 0, "delta": {"content": "Hel"}}]},
                  {"choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": "stop"}]})
    for size in (1, 7, len(stream)):
        tap = AnswerTap()
        for i in range(0, len(stream), size):
            tap.feed(stream[i:i + size])
        assert tap.choices[0].content == "Hello" and tap.finished
    tap = AnswerTap()
    tap.feed(_sse({"choices": [{"index": 0, "text": "a"}]}, {"error": {"message": "x"}}))
    assert not tap.finished
    tap = AnswerTap()
    tap.feed_body(json.dumps({"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "content": None, "tool_calls": [{"function": {"name": "f", "arguments": '{"a": 1}'}}]}}]}).encode())
    assert tap.finished and tap.choices[0].calls[0] == {"name": "f", "arguments": '{"a": 1}'}


def test_constraints_and_validity():
    chat = "/v1/chat/completions"
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}

    def check(c, text):
        tap = AnswerTap()
        tap.feed_body(json.dumps({"choices": [{"index": 0, "text": text, "finish_reason": "stop"}]}).encode())
        return valid(c, tap.choices[0])

    assert constraint_of(chat, {"messages": []}) is None
    c = constraint_of(chat, {"response_format": {"type": "json_schema", "json_schema": {"schema": schema}}})
    assert c == Constraint("json", schema)
    assert check(c, '{"n": 3}') is True and check(c, '{"n": "x"}') is False and check(c, '{"n": 3') is False
    assert check(constraint_of(chat, {"response_format": {"type": "json_object"}}), "[1]") is False
    regex = constraint_of("/v1/completions", {"structured_outputs": {"regex": "[0-9]+"}})
    assert check(regex, "123") is True and check(regex, "12a") is False
    choice = constraint_of("/v1/completions", {"guided_choice": ["yes", "no"]})
    assert check(choice, "no") is True and check(choice, "maybe") is False
    tools = constraint_of(chat, {"tools": [{"type": "function"}], "tool_choice": "required"})
    assert tools == Constraint("tools") and check(tools, "plain text") is False
    assert constraint_of(chat, {"tools": [{"type": "function"}], "tool_choice": "auto"}) is None
    assert constraint_of("/v1/responses", {"response_format": {"type": "json_object"}}) is None


def test_answer_nll_and_agreement():
    block = {"token_logprobs": [None, -0.5, -1.0, -2.0, -0.1],
             "top_logprobs": [None, {"a": -0.5}, {"b": -1.0}, {"c": -0.3, "d": -2.0}, {"e": -0.1}]}
    nll, agree = answer_nll(block, 3)
    assert nll == pytest.approx((1.0 + 2.0 + 0.1) / 3) and agree == pytest.approx(2 / 3)


def test_which_requests_are_sampled():
    assert shadowable("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    assert shadowable("/v1/completions", {"prompt": ["one"]}) and shadowable("/v1/completions", {"prompt": [1, 2]})
    for path, body in (("/v1/completions", {"prompt": ["a", "b"]}), ("/v1/completions", {"prompt": "a", "echo": True}),
                       ("/v1/chat/completions", {"messages": [], "tools": [{}]}), ("/v1/responses", {"input": "a"})):
        assert not shadowable(path, body)


def _monitor(**kw):
    cfg = SimpleNamespace(shadow_max_rps=kw.get("rps", 100.0), shadow_max_concurrency=kw.get("conc", 2),
                          shadow_max_load=kw.get("load", 2.0), stale_after=2.0, shadow_timeout=kw.get("timeout", 5.0),
                          shadow_yield=kw.get("shadow_yield", "reference"), shadow_max_tokens=128)
    pool = WorkerPool(["http://ref", "http://canary"])
    ref, canary = pool.workers.values()
    ref.models, canary.models = ("orig",), ("fast",)
    admission = SimpleNamespace(queued=kw.get("queued", 0), has_room=lambda w: True)
    metrics = SimpleNamespace()
    return ShadowMonitor(cfg, ModelDirectory(pool), None, admission, metrics, random.Random(0)), ref


def test_plan_samples_only_the_shadowed_models_at_their_fraction():
    mon, _ = _monitor()
    alias = parse_alias_flag("smol=orig:1,fast:1", default_fraction=0.5)
    body = {"model": "fast", "prompt": "x"}
    plans = [mon.plan(Routed("fast", alias, None, body, b""), "/v1/completions") for _ in range(2000)]
    assert abs(sum(p is not None for p in plans) / 2000 - 0.5) < 0.05
    assert all(p.reference == "orig" for p in plans if p)
    assert mon.plan(Routed("orig", alias, None, {"model": "orig", "prompt": "x"}, b""), "/v1/completions") is None
    assert mon.plan(Routed("fast", None, None, body, b""), "/v1/completions") is None      # no alias, no shadow
    constrained = {**body, "response_format": {"type": "json_object"}}
    plan = mon.plan(Routed("fast", None, None, constrained, b""), "/v1/completions")
    assert plan.reference is None and plan.constraint == Constraint("json")


def test_shedding_under_load_rate_and_concurrency():
    mon, ref = _monitor(load=2.0)
    assert mon._admit("orig") == (ref, "")
    ref.in_flight = 2                                           # the original's worker is busy
    assert mon._admit("orig") == (None, "shed_load")
    ref.in_flight = 0
    assert mon._admit("missing") == (None, "no_reference")
    queued, _ = _monitor(queued=1)                              # clients wait in the gateway: shadows go first
    assert queued._admit("orig") == (None, "shed_load")
    busy, _ = _monitor(conc=1)
    busy.running = 1
    assert busy._admit("orig") == (None, "shed_concurrency")
    slow, _ = _monitor(rps=0.001)
    assert slow._admit("orig")[1] == "" and slow._admit("orig") == (None, "shed_rate")


def test_yield_all_waits_for_an_idle_gateway_and_gives_way_to_each_client_request():
    async def main():
        mon, ref = _monitor(shadow_yield="all", timeout=0.5)
        (canary,) = [w for w in mon.directory.pool.workers.values() if w is not ref]
        outcomes, started, release = [], asyncio.Event(), asyncio.Event()
        mon.health = SimpleNamespace(on_dispatch=lambda w, t: None)
        mon.admission.release = lambda: None
        mon.m = SimpleNamespace(shadow_in_flight=SimpleNamespace(inc=lambda: None, dec=lambda: None),
                                shadow_requests=SimpleNamespace(
                                    labels=lambda model, o: SimpleNamespace(inc=lambda: outcomes.append(o))))

        async def score(session, url, w, text):
            started.set()
            await release.wait()
            return True

        mon._score = score
        job = Watch("fast", "/v1/completions", {"prompt": "x"}, "orig")
        canary.in_flight = 1                                    # a client request is in flight
        task = asyncio.ensure_future(mon._compare(None, ref, job, "answer"))
        await asyncio.sleep(0.2)
        assert not started.is_set() and ref.in_flight == 0      # the job waits, holding nothing
        canary.in_flight = 0
        await asyncio.wait_for(started.wait(), 2)
        assert ref.in_flight == 1                               # it holds its reference worker while it runs
        mon.client_request()                                    # a client request arrives: the job stops
        await asyncio.wait_for(task, 2)
        assert outcomes == ["preempted"] and ref.in_flight == 0 and mon.running == 0

        canary.in_flight = 1                                    # never idle: shed after --shadow-timeout
        await asyncio.wait_for(mon._compare(None, ref, job, "answer"), 3)
        assert outcomes[-1] == "shed_busy"
        canary.in_flight, started = 0, asyncio.Event()
        release.set()
        mon.client_request()                                    # nothing running: nothing to stop
        await asyncio.wait_for(mon._compare(None, ref, job, "answer"), 3)
        assert outcomes[-1] == "scored"

        plain, ref2 = _monitor()                                # --shadow-yield reference: clients stop nothing
        plain.health, plain.admission.release, plain.m, plain._score = mon.health, lambda: None, mon.m, score
        t2 = asyncio.ensure_future(plain._compare(None, ref2, job, "answer"))
        await asyncio.sleep(0.05)
        plain.client_request()
        await asyncio.wait_for(t2, 2)
        assert outcomes[-1] == "scored"

    asyncio.run(main())


def test_the_originals_own_answer_keeps_the_clients_stop_settings_within_the_answers_length():
    """The client's ``min_tokens`` can exceed what its answer re-tokenises to (a 400 from the original,
    seen in the overhead bench): the original's own answer is asked for at most as many tokens."""
    async def main():
        mon, _ = _monitor()
        posts, sink = [], SimpleNamespace(observe=lambda v: None)
        mon.m = SimpleNamespace(**{k: SimpleNamespace(labels=lambda *a: sink)
                                   for k in ("shadow_nll", "shadow_agreement", "shadow_gap")})

        async def post(session, url, path, body):
            posts.append((path, body))
            if path == "/tokenize":
                return {"tokens": [1, 2, 3]}
            if body.get("echo"):
                return {"choices": [{"index": i, "logprobs": {"token_logprobs": [-1.0] * 6,
                                                              "top_logprobs": [{"a": -1.0}] * 6}} for i in (0, 1)]}
            return {"choices": [{"text": "own"}]}

        mon._post = post
        w = Watch("fast", "/v1/completions", {"prompt": "x", "min_tokens": 16, "stop": ["."]}, "orig")
        assert await mon._score(None, "http://ref", w, "answer") is True
        (gen,) = [b for p, b in posts if p == "/v1/completions" and not b.get("echo")]
        assert gen["max_tokens"] == 3 and gen["min_tokens"] == 3 and gen["stop"] == ["."]

    asyncio.run(main())
