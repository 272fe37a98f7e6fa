"""benchmarks/gateway/failover_kinds.py (``swiftserve bench gateway failover --mix``): each kind's judge on canned SSE bytes.

A stream is complete when it ends normally, keeps one id and gives what the uninterrupted
stream gave (however the events split the text, as a migrated stream's do); an error event
or a failed response is an error, a stream without its end is lost, anything else is wrong.
"""

import json

import pytest
from test_perf_tools import load

fk = load("gateway.failover_kinds")
MAX = 4


def sse(*objs, done=True) -> bytes:
    out = b"".join(b"data: " + json.dumps(o).encode() + b"\n\n" for o in objs)
    return out + (b"data: [DONE]\n\n" if done else b"")


def chunk(kind="chat.completion.chunk", id_="c1", **choice) -> dict:
    return {"id": id_, "object": kind, "choices": [{"index": 0, **choice}]}


def usage(tokens, id_="c1") -> dict:
    return {"id": id_, "object": "chat.completion.chunk", "choices": [], "usage": {"completion_tokens": tokens}}


def chat(parts, finish="length", tokens=MAX, id_="c1", role=True) -> bytes:
    first = [chunk(id_=id_, delta={"role": "assistant", "content": ""})] if role else []
    body = [chunk(id_=id_, delta={"content": p}) for p in parts]
    return sse(*first, *body, chunk(id_=id_, delta={}, finish_reason=finish), usage(tokens, id_))


def completions(parts, tokens=MAX) -> bytes:
    objs = [chunk("text_completion", text=p, finish_reason=None) for p in parts]
    return sse(*objs, chunk("text_completion", text="", finish_reason="length"), usage(tokens))


def tools(arg_parts, call_ids=("call_1",), name="find_books") -> bytes:
    calls = [{"index": 0, "id": call_ids[0], "type": "function", "function": {"name": name, "arguments": ""}}]
    calls += [{"index": 0, **({"id": call_ids[1]} if len(call_ids) > 1 and i == 0 else {}),
               "function": {"arguments": a}} for i, a in enumerate(arg_parts)]
    return sse(chunk(delta={"role": "assistant", "content": None}), *[chunk(delta={"tool_calls": [c]}) for c in calls],
               chunk(delta={}, finish_reason="tool_calls"), usage(9))


def n2(texts0, texts1, roles=(1, 1)) -> bytes:
    objs = []
    for i, n in enumerate(roles):
        objs += [{"id": "c1", "object": "chat.completion.chunk",
                  "choices": [{"index": i, "delta": {"role": "assistant", "content": ""}}]}] * n
    for a, b in zip(texts0, texts1):
        objs += [{"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": a}}]},
                 {"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 1, "delta": {"content": b}}]}]
    objs += [{"id": "c1", "object": "chat.completion.chunk",
              "choices": [{"index": i, "delta": {}, "finish_reason": "length"}]} for i in range(2)]
    return sse(*objs, usage(2 * MAX))


def responses(parts, status="completed", seq_gap=False, resp_ids=("resp_a",), item="msg_a", end=True) -> bytes:
    evs = [{"type": "response.created", "response": {"id": resp_ids[0], "status": "in_progress"}},
           {"type": "response.output_item.added", "item": {"type": "message", "id": item}}]
    evs += [{"type": "response.output_text.delta", "item_id": item, "delta": p} for p in parts]
    evs += [{"type": "response.output_text.done", "item_id": item, "text": "".join(parts)}]
    if end:
        evs.append({"type": f"response.{status}", "response": {"id": resp_ids[-1], "status": status,
                                                                "usage": {"output_tokens": 7}}})
    out = b""
    for n, e in enumerate(evs):
        e["sequence_number"] = n + (1 if seq_gap and n > 2 else 0)
        out += f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode()
    return out


WANT = {
    "completions": completions(["Once", " upon", " a", " time"]),
    "chat": chat(["Once", " upon", " a", " time"]),
    "json_schema": chat(['{"title"', ': "Sea"}'], finish="stop", tokens=6),
    "tools": tools(['{"topic": ', '"tea", "count": 3}']),
    "chat_n2": n2(["a", "b"], ["c", "d"]),
    "responses": responses(["The", " sea", " is", " wide."]),
}
# The same outputs as a migrated stream carries them: other event boundaries, nothing else changed.
MIGRATED = {
    "completions": completions(["Once up", "on", " a time"]),
    "chat": chat(["Once upon", " a", " time"]),
    "json_schema": chat(['{"ti', 'tle": "Sea"}'], finish="stop", tokens=6),
    "tools": tools(['{"topic": "tea", ', '"count": 3}']),
    "chat_n2": n2(["ab", ""], ["", "cd"]),
    "responses": responses(["The sea", " is wide."]),
}
# Each kind's failures judged "wrong": the output differs, or the stream broke an invariant.
WRONG = {
    "completions": [completions(["Once", " upon", " a", " tim"]), completions(["Once upon a time"], tokens=3)],
    "chat": [chat(["Once upon", " a", " time"], tokens=5), chat(["Once upon a time"], role=False),
             chat(["Once upon a time"], finish="stop"), chat(["Once upon", " a time"]).replace(b'"c1"', b'"c2"', 2)],
    "json_schema": [chat(['{"title": "Se"}'], finish="stop", tokens=6),
                    chat(['{"title": "Sea"}'], finish="stop", tokens=5)],
    "tools": [tools(['{"topic": "tea", "count": 4}']), tools(['{"topic": "tea", "count": 3}'], name="find_book"),
              tools(['{"topic": "tea", "count": 3}'], call_ids=("call_1", "call_2"))],
    "chat_n2": [n2(["a", "b"], ["c", "e"]), n2(["c", "d"], ["a", "b"]), n2(["a", "b"], ["c", "d"], roles=(1, 2))],
    "responses": [responses(["The sea is wide"]), responses(["The sea is wide."], status="incomplete"),
                  responses(["The sea is wide."], seq_gap=True), responses(["The sea is wide."], resp_ids=("a", "b")),
                  responses(["The sea", " is wide."]).replace(b'"msg_a", "delta": " is', b'"msg_b", "delta": " is')],
}


@pytest.mark.parametrize("kind", fk.KINDS)
def test_a_stream_equal_to_the_uninterrupted_one_is_complete_however_its_events_split(kind):
    want = fk.read(WANT[kind])
    assert want["ended"] and not want["error"] and want["one_id"]
    assert fk.judge_kind(kind, WANT[kind], want, MAX) == "complete"
    assert fk.judge_kind(kind, MIGRATED[kind], want, MAX) == "complete"


@pytest.mark.parametrize("kind", fk.KINDS)
def test_other_output_or_a_broken_invariant_is_wrong(kind):
    want = fk.read(WANT[kind])
    for i, data in enumerate(WRONG[kind]):
        assert fk.judge_kind(kind, data, want, MAX) == "wrong", (kind, i, fk.read(data))


def test_the_kinds_read_what_they_carry():
    assert json.loads(fk.read(WANT["tools"])["output"]) == {"0": ["", [["find_books", '{"topic": "tea", "count": 3}']]]}
    assert json.loads(fk.read(WANT["chat_n2"])["output"]) == {"0": ["ab", []], "1": ["cd", []]}
    assert fk.read(WANT["chat_n2"])["finish"] == [["length"], ["length"]]
    assert json.loads(fk.read(WANT["responses"])["output"]) == ["The sea is wide.", []]
    assert fk.read(WANT["responses"])["finish"] == "completed" and fk.read(WANT["responses"])["tokens"] == 7


def test_an_ignore_eos_kind_must_report_its_fixed_token_count():
    short = chat(["Once upon a time"], tokens=3)
    assert fk.judge_kind("chat", short, fk.read(short), MAX) == "wrong"      # even when the direct run agreed
    assert fk.fixed_tokens("chat_n2", MAX) == 2 * MAX and fk.fixed_tokens("tools", MAX) is None


ERROR = {"code": "upstream_error", "message": "worker lost"}


@pytest.mark.parametrize("kind", fk.KINDS)
def test_an_error_event_is_an_error_and_a_stream_without_its_end_is_lost(kind):
    want = fk.read(WANT[kind])
    cut = MIGRATED[kind][:MIGRATED[kind].rfind(b"data:")]     # the last event (the end) never came
    assert fk.judge_kind(kind, cut, want, MAX) == "lost"
    assert fk.judge_kind(kind, cut[:len(cut) // 2], want, MAX) == "lost"
    assert fk.judge_kind(kind, b"", want, MAX) == "lost"
    errored = cut + sse({"error": ERROR})                     # the gateway's error event + [DONE]
    assert fk.judge_kind(kind, errored, want, MAX) == "error"
    assert fk.read(errored)["error"] == "upstream_error: worker lost"


def test_a_failed_response_is_an_error():
    failed = responses(["The sea"], end=False) + (
        b'event: response.failed\ndata: {"type": "response.failed", "sequence_number": 5, "response": '
        b'{"id": "resp_a", "status": "failed", "error": {"code": "engine_error", "message": "boom"}}}\n\n')
    got = fk.read(failed)
    assert got["ended"] and got["error"] == "engine_error: boom"
    assert fk.judge_kind("responses", failed, fk.read(WANT["responses"]), MAX) == "error"


@pytest.mark.parametrize("kind", fk.KINDS)
def test_every_kind_asks_for_a_greedy_stream(kind):
    path, body = fk.request(kind, "tea", 96)
    assert body["stream"] is True and body["temperature"] == 0 and "tea" in json.dumps(body)
    assert path in ("/v1/completions", "/v1/chat/completions", "/v1/responses")
    assert body.get("ignore_eos", False) == (fk.fixed_tokens(kind, 96) is not None)
    assert body.get("max_tokens", body.get("max_output_tokens")) == 96


def test_the_default_benchmark_judges_as_before_and_counts_per_kind():
    fb = load("gateway.failover")
    data = completions(["Once", " upon", " a", " time"])
    assert fb.judge(data, "Once upon a time", MAX) == "complete"
    assert fb.judge(data, "Once upon a tim", MAX) == "wrong"
    assert fb.judge(data[:-14], "Once upon a time", MAX) == "lost"
    counts = fb.per_kind(["chat", "tools", "chat"], ["complete", "error", "wrong"], [False, True, False])
    assert counts["chat"] == {"streams": 2, "complete": 1, "wrong": 1, "error": 0, "lost": 0, "ended_before_fault": 0}
    assert counts["tools"]["error"] == 1 and counts["tools"]["ended_before_fault"] == 1


def test_a_mixed_scenario_runs_every_kind_and_counts_each(monkeypatch):
    """``mixed`` + ``scenario`` against canned answers (no processes): the direct run and the gateway answer
    alike except for one tools stream cut (lost) and the responses streams' error event."""
    import asyncio
    import types

    import httpx

    fb = load("gateway.failover")
    kind_of = {json.dumps(fb.request(k, t, MAX)[1]): k for k in fk.KINDS for t in fb.TOPICS}
    seen = []

    def answer(body: dict, via_gateway: bool) -> bytes:
        kind = kind_of[json.dumps(body)]
        seen.append((kind, via_gateway))
        if via_gateway and kind == "responses":
            return MIGRATED[kind][:MIGRATED[kind].rfind(b"event:")] + sse({"error": ERROR})
        if via_gateway and kind == "tools" and "rivers" in json.dumps(body):
            return MIGRATED[kind][:40]
        return MIGRATED[kind] if via_gateway else WANT[kind]

    monkeypatch.setattr(fb.httpx, "post", lambda url, json, timeout: types.SimpleNamespace(
        content=answer(json, via_gateway=False)))

    async def chunks(data: bytes):
        yield data

    transport = httpx.MockTransport(lambda r: httpx.Response(200, content=chunks(answer(json.loads(r.content), True))))
    real = httpx.AsyncClient
    monkeypatch.setattr(fb.httpx, "AsyncClient", lambda timeout: real(transport=transport, timeout=timeout))
    monkeypatch.setattr(fb, "migrations", lambda gw: 0.0)
    signals = []
    victim = types.SimpleNamespace(signal=signals.append)
    reqs, judges, kinds = fb.mixed("http://w", 12, MAX)
    out = asyncio.run(fb.scenario(types.SimpleNamespace(url="http://gw"), victim, "kill", reqs, judges, kinds))
    assert signals == [fb.signal.SIGKILL] and len(seen) == 24 and len({json.dumps(b) for _, b in reqs}) == 12
    assert (out["streams"], out["complete"], out["error"], out["lost"], out["wrong"]) == (12, 9, 2, 1, 0)
    assert out["error_messages"] == ["upstream_error: worker lost"]
    tools = out["kinds"]["tools"]
    assert out["kinds"]["responses"]["error"] == 2 and tools.pop("ended_before_fault") in (0, 1, 2)
    assert tools == {"streams": 2, "complete": 1, "wrong": 0, "error": 0, "lost": 1}
    assert all(out["kinds"][k]["complete"] == 2 for k in ("completions", "chat", "json_schema", "chat_n2"))
