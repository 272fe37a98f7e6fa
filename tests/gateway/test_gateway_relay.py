"""gateway.relay and gateway.failover without processes: the one relay loop over fake upstream answers,
a stream that cannot migrate, and migration through the dispatcher's public interface (completions,
n > 1 legs, Responses, a refused continuation)."""

import asyncio
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import aiohttp

sys.path.insert(0, str(Path(__file__).parent))
from test_gateway_migration_rules import responses_events, sse  # noqa: E402

from gateway.admission import Rejected  # noqa: E402
from gateway.failover import Failover  # noqa: E402
from gateway.migration import ResponsesTracker, StreamTracker  # noqa: E402
from gateway.relay import RelayedStream  # noqa: E402
from gateway.streaming import StreamStats  # noqa: E402


class Body:
    def __init__(self, chunks) -> None:
        self.chunks = list(chunks)

    async def readany(self) -> bytes:
        if not self.chunks:
            return b""
        chunk = self.chunks.pop(0)
        if isinstance(chunk, Exception):
            raise chunk
        return chunk

    async def read(self, n: int) -> bytes:
        return b"".join(c for c in self.chunks if isinstance(c, bytes))[:n]

    def at_eof(self) -> bool:
        return not self.chunks


class Resp:
    def __init__(self, chunks, status=200, headers=None) -> None:
        self.content, self.status, self.closed = Body(chunks), status, False
        self.headers = {"content-type": "text/event-stream", **(headers or {})}

    def close(self) -> None:
        self.closed = True

    release = close


class FakeLease:
    def __init__(self, url: str) -> None:
        self.worker, self.outcome = SimpleNamespace(url=url), "open"

    def finish(self, ok) -> None:
        if self.outcome == "open":              # like gateway.upstream.Lease: once
            self.outcome = ok


class Counts:
    def __init__(self) -> None:
        self.seen = []

    def labels(self, *labels):
        self.seen.append(labels)
        return SimpleNamespace(inc=lambda: None)


class FakeDispatcher:
    """gateway.dispatch.Dispatcher's public interface over a list of answers, one per dispatch."""

    def __init__(self, answers, limit: int = 1 << 20) -> None:
        self.answers, self.leases, self.bodies = list(answers), [], []
        self.cfg = SimpleNamespace(max_response_bytes=limit, stall_timeout=5.0, max_attempts=2)
        self.m = SimpleNamespace(retries=Counts(), migrations=Counts())

    async def lease(self, workers, choose, tried):
        if not self.answers:
            raise Rejected(503, "no_worker", "no worker left")
        lease = FakeLease(f"http://w{len(self.leases)}")
        tried.add(lease.worker.url)
        self.leases.append(lease)
        return lease

    async def post(self, lease, session, path, body: bytes):
        self.bodies.append(json.loads(body))
        return self.answers.pop(0)

    async def first_bytes(self, lease, resp) -> bytes:
        return await resp.content.readany()


def ev(obj) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def run(stream) -> bytes:
    sent = []

    async def send(msg):
        assert msg["more_body"] is True
        sent.append(msg["body"])

    async def go():
        await stream.pump(send)
        stream.close()

    asyncio.run(go())
    return b"".join(sent)


def plain(chunks, limit=1 << 20):
    d = FakeDispatcher([], limit)
    lease, resp = FakeLease("http://w"), Resp(chunks[1:])
    return d, lease, resp, RelayedStream(d, lease, resp, chunks[0], StreamStats(0.0))


def test_a_plain_stream_passes_whole_events_unchanged_and_reads_to_the_end():
    a, b = ev({"choices": [{"text": "He"}]}), ev({"choices": [{"text": "llo"}], "usage": {"completion_tokens": 2}})
    d, lease, resp, stream = plain([a[:7], a[7:] + b[:3], b[3:], b"data: [DONE]\n\n"])
    assert run(stream) == a + b + b"data: [DONE]\n\n"
    assert lease.outcome is True and not stream.failed and stream.stats.completion_tokens == 2 and resp.closed


def test_a_plain_stream_that_fails_ends_with_one_error_event():
    a = ev({"choices": [{"text": "He"}]})
    cases = [([a], 1 << 20, "truncated_stream"), ([a, b"data: nope\n\n"], 1 << 20, "bad_event"),
             ([a, a, a], len(a) * 2, "response_too_large"),
             ([a, aiohttp.ClientPayloadError("cut")], 1 << 20, "ClientPayloadError")]
    for chunks, limit, reason in cases:
        d, lease, _, stream = plain(chunks, limit)
        out = run(stream)
        *events, done = [e for e in out.split(b"\n\n") if e]
        assert done == b"data: [DONE]" and json.loads(events[-1][6:])["error"]["code"] == reason, reason
        assert lease.outcome is False and d.m.retries.seen == [("after_first_byte_" + reason,)]


def chunk(rid, text, ids, index=0, finish=None):
    return {"id": rid, "created": 1, "choices": [{"index": index, "text": text, "token_ids": ids,
                                                 "finish_reason": finish}]}


def failover(d, tracker, first_resp):
    lease = FakeLease("http://first")
    return lease, Failover(d, None, "/v1/completions", None, set(), tracker, lease, first_resp,
                           first_resp.content.chunks.pop(0), StreamStats(0.0), [])


def texts(out: bytes) -> list:
    return [e if e == b"data: [DONE]" else json.loads(e[6:]) for e in out.split(b"\n\n") if e]


def test_a_cut_stream_resumes_on_another_worker_as_the_same_stream():
    t = StreamTracker({"prompt": "x", "stream": True}, max_migrations=2)
    first = Resp([ev(chunk("a", "He", [1])) + ev(chunk("a", "l", [2])), aiohttp.ClientPayloadError("cut")])
    second = Resp([ev(chunk("b", "lo", [3], finish="length")) + b"data: [DONE]\n\n"],
                  headers={"x-swiftserve-continuation": "2"})
    d = FakeDispatcher([second])
    lease, fo = failover(d, t, first)
    *events, done = texts(run(fo))
    assert [e["choices"][0]["text"] for e in events] == ["He", "l", "lo"] and done == b"data: [DONE]"
    assert {e["id"] for e in events} == {"a"} and not any("token_ids" in e["choices"][0] for e in events)
    assert d.bodies[0]["continuation_token_ids"] == [1, 2] and d.bodies[0]["return_token_ids"] is True
    assert lease.outcome is False and d.leases[0].outcome is True and first.closed and second.closed
    assert d.m.migrations.seen == [("ClientPayloadError", "resumed")] and not fo.failed


def test_an_n2_stream_resumes_as_legs_and_ends_with_one_usage_chunk():
    t = StreamTracker({"prompt": "x", "stream": True, "n": 2, "stream_options": {"include_usage": True}}, 2)
    first = Resp([ev(chunk("a", "A", [1], 0)) + ev(chunk("a", "B", [7], 1)), aiohttp.ClientPayloadError("cut")])
    usage = {"id": "b", "created": 2, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
    legs = [Resp([ev(chunk("b", "a", [2], 0, "length")) + ev(usage) + b"data: [DONE]\n\n"],
                 headers={"x-swiftserve-continuation": "1"}) for _ in range(2)]
    d = FakeDispatcher(legs)
    _, fo = failover(d, t, first)
    *events, summed, done = texts(run(fo))
    assert sorted(e["choices"][0]["index"] for e in events) == [0, 0, 1, 1] and done == b"data: [DONE]"
    assert summed["id"] == "a" and summed["usage"] == {"prompt_tokens": 3, "completion_tokens": 4,
                                                       "total_tokens": 7}
    assert [b["continuation_token_ids"] for b in d.bodies] == [[1], [7]] and all(b["n"] == 1 for b in d.bodies)
    assert [lease.outcome for lease in d.leases] == [True, True] and not fo.failed


def test_a_responses_stream_resumes_through_the_same_protocol():
    t = ResponsesTracker({"input": "x", "stream": True}, max_migrations=2)
    first = Resp([sse("response.created", sequence_number=0, response={"id": "resp_a", "created_at": 1})
                  + sse("response.output_text.delta", sequence_number=1, item_id="msg_a", delta="He",
                        token_ids=[1, 2]), aiohttp.ClientPayloadError("cut")])
    second = Resp([sse("response.output_text.delta", sequence_number=0, item_id="msg_b", delta="y", token_ids=[3])
                   + sse("response.completed", sequence_number=1, response={"id": "resp_b", "created_at": 2})],
                  headers={"x-swiftserve-continuation": "2"})
    d = FakeDispatcher([second])
    _, fo = failover(d, t, first)
    out = run(fo)
    assert b"[DONE]" not in out and t.finished and d.bodies[0]["continuation_token_ids"] == [1, 2]
    events = responses_events(out)
    assert [e["sequence_number"] for e in events] == [0, 1, 2, 3] and events[-1]["response"]["id"] == "resp_a"


def test_a_refused_continuation_ends_the_stream_with_the_refusal_and_spares_the_worker():
    t = StreamTracker({"prompt": "x", "stream": True}, max_migrations=2)
    first = Resp([ev(chunk("a", "He", [1])), aiohttp.ClientPayloadError("cut")])
    refusal = Resp([json.dumps({"error": {"message": "no grammar here"}}).encode()], status=400,
                   headers={"content-type": "application/json"})
    d = FakeDispatcher([refusal])
    _, fo = failover(d, t, first)
    *events, done = texts(run(fo))
    assert events[-1]["error"]["code"] == "http_400" and "no grammar here" in events[-1]["error"]["message"]
    assert done == b"data: [DONE]" and fo.failed and d.leases[0].outcome is None and refusal.closed
    assert d.m.migrations.seen == [("ClientPayloadError", "failed")]
