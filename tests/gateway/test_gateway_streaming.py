"""The SSE pass-through response on its own (fake ASGI receive/send): a finished stream
ends cleanly even though the server then reports "disconnect"; a client that leaves
mid-stream stops the pump at once; cleanup runs exactly once either way; event checks."""

import asyncio

from gateway.streaming import SSEStream, StreamStats, event_end, valid_prefix
import pytest

pytestmark = pytest.mark.e2e


def run_stream(pump, disconnect_after: float | None):
    sent, closed = [], []
    done = asyncio.Event()

    async def receive():
        if disconnect_after is None:
            await done.wait()                   # as uvicorn: "disconnect" once the response is complete
        else:
            await asyncio.sleep(disconnect_after)
        return {"type": "http.disconnect"}

    async def send(msg):
        sent.append(msg)
        if msg["type"] == "http.response.body" and not msg.get("more_body"):
            done.set()

    async def on_close():
        closed.append(True)

    async def main():
        await SSEStream(200, [(b"content-type", b"text/event-stream")], pump, on_close)({}, receive, send)
        await asyncio.sleep(0.05)               # a stray cancel would surface here
        return asyncio.current_task().cancelling() if hasattr(asyncio.Task, "cancelling") else 0

    pending = asyncio.run(main())
    return sent, closed, pending


def test_a_finished_stream_ends_cleanly():
    async def pump(send):
        for i in range(3):
            await send({"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True})
            await asyncio.sleep(0.01)

    sent, closed, pending = run_stream(pump, None)
    assert [m.get("more_body") for m in sent[1:]] == [True, True, True, False]
    assert closed == [True] and pending == 0


def test_a_client_leaving_mid_stream_stops_the_pump():
    progress = []

    async def pump(send):
        for _ in range(100):
            progress.append(1)
            await asyncio.sleep(0.01)

    sent, closed, pending = run_stream(pump, 0.05)
    assert len(progress) < 50 and closed == [True] and pending == 0
    assert not any(m.get("more_body") is False for m in sent)


def test_event_boundaries_validation_and_markers():
    buf = b'data: {"a": 1}\n\ndata: {"b": 2}\n\ndata: {"c"'
    assert event_end(buf) == len(b'data: {"a": 1}\n\ndata: {"b": 2}\n\n')
    assert valid_prefix(b'data: {"a": 1}\n\ndata: [DONE]\n\n') == len(b'data: {"a": 1}\n\ndata: [DONE]\n\n')
    assert valid_prefix(b'data: {"a": 1}\n\ndata: {oops}\n\n') == len(b'data: {"a": 1}\n\n')
    assert valid_prefix(b'data: {"a": 1}\r\n\r\ndata: nope\r\n\r\n') == len(b'data: {"a": 1}\r\n\r\n')
    assert valid_prefix(b'data: {"x": NaN}\n\n') == len(b'data: {"x": NaN}\n\n')    # what Python emits
    s = StreamStats(0.0)
    s.feed(b'data: {"choices": [{"text": "hi"}]}\n\n')
    s.feed(b'data: {"usage": {"completion_tokens": 7}}\n\n')
    assert s.first_token is not None and s.completion_tokens == 7
