"""gateway.migration without processes: which requests may migrate, and how events are rewritten (completions,
chat and Responses trackers)."""

import json

import pytest

from gateway.migration import ResponsesTracker, StreamTracker, migratable, rewrite

C, CHAT = "/v1/completions", "/v1/chat/completions"


@pytest.mark.parametrize("path,body,ok", [
    (C, {"prompt": "x", "stream": True}, True),
    (CHAT, {"messages": [], "stream": True, "tools": [{}], "tool_choice": "none"}, True),
    (C, {"prompt": ["x"], "stream": True}, True),
    (C, {"prompt": "x"}, False),                                        # not streamed: re-run instead
    (C, {"prompt": "x", "stream": True, "n": 2}, True),                   # each choice resumes on its own
    (C, {"prompt": "x", "stream": True, "n": 0}, False),
    (C, {"prompt": "x", "stream": True, "echo": True}, False),
    (C, {"prompt": ["x", "y"], "stream": True}, False),
    (CHAT, {"messages": [], "stream": True, "tools": [{}]}, True),             # the worker replays the holding
    (CHAT, {"messages": [], "stream": True, "tools": [{}], "tool_choice": "required"}, True),
    (CHAT, {"messages": [], "stream": True, "response_format": {"type": "json_object"}}, True),
    (C, {"prompt": "x", "stream": True, "guided_regex": "a+"}, True),           # the worker advances the grammar
    (C, {"prompt": "x", "stream": True, "continuation_token_ids": [1]}, False),
    ("/v1/responses", {"input": "x", "stream": True}, False),
])
def test_which_requests_may_migrate(path, body, ok):
    assert migratable(path, body) is ok


def ev(obj) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def chunk(rid, text, ids, finish=None, stop=None, logprobs=None):
    return {"id": rid, "created": 1 if rid == "a" else 2, "choices": [
        {"index": 0, "text": text, "token_ids": ids, "logprobs": logprobs, "finish_reason": finish,
         "stop_reason": stop}]}


def parsed(out: bytes) -> list:
    return [json.loads(e[6:]) if e != b"data: [DONE]" else "[DONE]" for e in out.split(b"\n\n") if e]


def test_ids_are_kept_for_the_gateway_and_the_stream_keeps_its_id():
    t = StreamTracker({"prompt": "x", "stream": True}, max_migrations=2)
    out, migrate, ended = rewrite(t, ev(chunk("a", "He", [1])) + ev(chunk("a", "", [2])) + ev(chunk("a", "llo", [3])))
    assert [e["choices"][0]["text"] for e in parsed(out)] == ["He", "llo"]     # the ids-only chunk is dropped
    assert not any("token_ids" in e["choices"][0] for e in parsed(out))
    assert t.token_ids == [1, 2, 3] and migrate is None and not ended and t.can_migrate()
    assert json.loads(t.resume()[0])["continuation_token_ids"] == [1, 2, 3]
    t.migrations = 1
    out, _, ended = rewrite(t, ev(chunk("b", " world", [4], "length")) + b"data: [DONE]\n\n")
    first = parsed(out)[0]
    assert first["id"] == "a" and first["created"] == 1 and ended and t.finished and not t.can_migrate()


def test_drain_abort_and_engine_errors_migrate_other_errors_pass():
    t = StreamTracker({"prompt": "x", "stream": True, "return_token_ids": True}, max_migrations=1)
    out, migrate, _ = rewrite(t, ev(chunk("a", "Hi", [1], "abort", "worker_shutdown")) + b"data: [DONE]\n\n")
    (only,) = parsed(out)
    assert only["choices"][0]["finish_reason"] is None and only["choices"][0]["token_ids"] == [1]
    assert migrate.reason == "worker_drain" and t.can_migrate()
    out, migrate, _ = rewrite(t, ev({"error": {"message": "x", "code": "engine_error"}}))
    assert out == b"" and migrate.reason == "worker_error"
    out, migrate, _ = rewrite(t, ev({"error": {"message": "bad", "code": None}}))
    assert migrate is None and parsed(out)[0]["error"]["message"] == "bad"


def test_a_worker_without_token_ids_cannot_be_migrated_from():
    t = StreamTracker({"prompt": "x", "stream": True}, max_migrations=2)
    rewrite(t, ev({"choices": [{"index": 0, "text": "tok", "finish_reason": None}]}))
    assert not t.can_migrate()


def test_a_rerun_chat_stream_sends_one_role_chunk():
    t = StreamTracker({"messages": [], "stream": True}, max_migrations=2)
    role = {"id": "a", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "token_ids": []}]}
    assert len(parsed(rewrite(t, ev(role))[0])) == 1
    t.migrations = 1
    assert rewrite(t, ev({**role, "id": "b"}))[0] == b""
    body, n = t.resume()
    assert n == 0 and "continuation_token_ids" not in json.loads(body)       # nothing generated yet: a re-run


def test_completion_text_offsets_count_from_the_start_of_the_whole_text():
    t = StreamTracker({"prompt": "x", "stream": True, "logprobs": 1}, max_migrations=2)
    rewrite(t, ev(chunk("a", "Hello", [1], logprobs={"text_offset": [0]})))
    t.resume()
    t.migrations = 1
    out, _, _ = rewrite(t, ev(chunk("b", " you", [2], logprobs={"text_offset": [0]})))
    assert parsed(out)[0]["choices"][0]["logprobs"]["text_offset"] == [5]


def test_tool_call_deltas_reach_the_client_and_a_failure_inside_their_burst_is_not_resumed():
    t = StreamTracker({"messages": [], "stream": True, "tools": [{}]}, max_migrations=2)
    held = {"id": "a", "choices": [{"index": 0, "delta": {}, "token_ids": [7, 8]}]}
    assert rewrite(t, ev(held))[0] == b"" and t.token_ids == [7, 8] and t.can_migrate()     # held back: ids only
    call = {"id": "a", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "type":
                                                                          "function", "function": {"name": "f"}}]},
                                    "token_ids": []}]}
    (sent,) = parsed(rewrite(t, ev(call))[0])
    assert sent["choices"][0]["delta"]["tool_calls"][0]["id"] == "call_1" and "token_ids" not in sent["choices"][0]
    assert not t.can_migrate()                  # inside the final burst: resuming would send the calls twice


def test_an_n2_stream_resumes_each_unfinished_choice_as_a_leg_of_its_own():
    t = StreamTracker({"prompt": "x", "stream": True, "n": 3, "best_of": 3, "seed": 5, "logprobs": 1}, max_migrations=2)
    c0, c1, c2 = (dict(chunk("a", "", [])["choices"][0], index=i) for i in range(3))
    events = [{"id": "a", "created": 1, "choices": [dict(c0, text="He", token_ids=[1])]},
              {"id": "a", "created": 1, "choices": [dict(c1, text="Yo", token_ids=[7, 8], finish_reason="stop")]},
              {"id": "a", "created": 1, "choices": [dict(c2, text="Hi", token_ids=[4])]},
              {"id": "a", "created": 1, "choices": [dict(c2, text="!", token_ids=[5])]}]
    out, migrate, _ = rewrite(t, b"".join(ev(e) for e in events))
    assert [e["choices"][0]["index"] for e in parsed(out)] == [0, 1, 2, 2] and t.can_migrate() and not t.finished
    t.migrations = 1
    legs = t.legs()
    assert [leg.index for leg in legs] == [0, 2]                     # choice 1 had finished
    bodies = [json.loads(leg.resume()[0]) for leg in legs]
    assert [b["continuation_token_ids"] for b in bodies] == [[1], [4, 5]]
    assert all(b["n"] == 1 and "best_of" not in b for b in bodies) and [b["seed"] for b in bodies] == [5, 7]
    leg = legs[1]
    piece = chunk("b", " you", [6], "length", logprobs={"text_offset": [0]})
    usage = {"id": "b", "created": 2, "object": "text_completion", "model": "m", "choices": [],
             "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}}
    out, _, ended = rewrite(leg, ev(piece) + ev(usage) + b"data: [DONE]\n\n")
    (only,) = parsed(out)                                            # its usage and [DONE] are the stream's
    assert ended and only["id"] == "a" and only["choices"][0]["index"] == 2
    assert only["choices"][0]["logprobs"]["text_offset"] == [3]      # after choice 2's "Hi!"
    legs[0].usage = {**usage, "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}}
    summed = parsed(t.summed_usage(legs))[0]
    assert summed["id"] == "a" and summed["usage"] == {"prompt_tokens": 3, "completion_tokens": 5 + 2 + 4,
                                                        "total_tokens": 14}


def test_an_n2_stream_with_an_unresumable_choice_does_not_move():
    t = StreamTracker({"messages": [], "stream": True, "n": 2}, max_migrations=2)
    call = {"id": "a", "choices": [{"index": 1, "delta": {"tool_calls": [{"index": 0, "id": "call_1"}]},
                                    "token_ids": []}]}
    rewrite(t, ev({"id": "a", "choices": [{"index": 0, "delta": {"content": "x"}, "token_ids": [1]}]}) + ev(call))
    assert not t.can_migrate()


def sse(kind: str, **data) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()


def responses_events(out: bytes) -> list:
    """A Responses stream's events (each block's ``event:`` name checked against its ``type``)."""
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
    assert [e["type"] for e in responses_events(out)] == ["response.created", "response.output_item.added",
                                                "response.output_text.delta"]
    assert "token_ids" not in responses_events(out)[2] and t.token_ids == [1, 2, 3] and t.can_migrate() and not ended
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
    events = responses_events(out)
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
