"""A client that goes away aborts its engine requests (streaming and not, queued or
running, every choice of an n>1 request), and frees its admission slot. Runs a real
uvicorn server so the disconnect is a real closed socket."""

import socket
import time

import httpx
import pytest
from worker_test_fakes import FakeEngineClient

pytestmark = pytest.mark.e2e


def wait_for(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": "x", "max_tokens": 200, "stream": True}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 150, "stream": True,
                              "n": 3}),
])
def test_streaming_disconnect_aborts(serve, path, body):
    srv, engine = serve(FakeEngineClient(token_delay=0.05), max_concurrent_requests=4)
    with httpx.Client(timeout=10) as c:
        with c.stream("POST", srv.url + path, json=body) as r:
            lines = r.iter_lines()
            got = [next(lines) for _ in range(6)]
            assert any(g.startswith("data: {") for g in got)
    n = body.get("n", 1)
    assert wait_for(lambda: len(engine.aborted) == n and not engine.active)
    assert sorted(engine.aborted) == sorted(engine.requests)
    assert not engine.finished                       # none ran to max_tokens
    assert wait_for(lambda: httpx.get(srv.url + "/load").json()["in_flight"] == 0)
    metrics = httpx.get(srv.url + "/metrics").text
    assert 'vllm:request_success_total{engine="0",finished_reason="abort",model_name="fake-model"} %d.0' % n in metrics


def test_non_streaming_disconnect_aborts(serve):
    srv, engine = serve(FakeEngineClient(token_delay=0.05))
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 200}, timeout=0.5)
    assert wait_for(lambda: len(engine.aborted) == 1 and not engine.active)
    assert not engine.finished


def test_disconnect_while_queued_aborts(serve):
    srv, engine = serve(FakeEngineClient(first_token_delay=30))
    body = b'{"prompt": "x", "max_tokens": 5, "stream": true}'
    with socket.create_connection(("127.0.0.1", srv.port)) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        assert wait_for(lambda: len(engine.requests) == 1)
    assert wait_for(lambda: len(engine.aborted) == 1 and not engine.active)
