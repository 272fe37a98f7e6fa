"""Graceful shutdown (worker.shutdown.DrainingServer): on SIGTERM admission stops (503
shutting_down), /health turns 503 so routers stop sending, in-flight requests finish; past
the drain deadline they are aborted and still end cleanly (finish_reason "abort", [DONE]);
then the process exits 0."""

import json
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
import uvicorn
from benchmarks.lib.procs import free_port, wait_healthy
from worker_test_fakes import FakeEngineClient, parse_sse

from worker.shutdown import DrainingServer

pytestmark = pytest.mark.e2e

STREAM = {"model": "fake-model", "prompt": "Hello", "max_tokens": 30, "stream": True}


def test_drain_finishes_in_flight_and_refuses_new_work(make_app):
    app, engine = make_app(FakeEngineClient(token_delay=0.05))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = DrainingServer(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"),
                            app.state.serving, drain_timeout=30)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    body = {}

    def stream():
        with httpx.stream("POST", url + "/v1/completions", json=STREAM, timeout=30) as r:
            body["text"] = "".join(r.iter_text())

    client = threading.Thread(target=stream)
    client.start()
    while not app.state.serving.in_flight:
        time.sleep(0.01)
    server.handle_exit(signal.SIGTERM, None)                  # what the signal handler does
    r = httpx.post(url + "/v1/completions", json={**STREAM, "stream": False}, timeout=10)
    assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down" and r.headers["retry-after"]
    h = httpx.get(url + "/health", timeout=10)
    assert h.status_code == 503 and h.json()["error"]["code"] == "shutting_down"
    assert httpx.get(url + "/load", timeout=10).json()["draining"] is True
    client.join(30)
    events = parse_sse(body["text"])
    assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "length"
    thread.join(10)
    assert not thread.is_alive() and engine.stopped                 # exited once idle; engine shut down


@pytest.mark.slow
@pytest.mark.model
def test_sigterm_past_the_deadline_aborts_cleanly(smollm2_dir, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "worker.log", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "worker", "--model", str(smollm2_dir), "--port", str(port),
                             "--served-model-name", "m", "--max-model-len", "512", "--kv-cache-memory-gb", "0.05",
                             "--drain-timeout", "1"], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_healthy(url, proc, 180, log)
        results, started = [], [threading.Event() for _ in range(2)]

        def stream(started: threading.Event):
            body = {"model": "m", "prompt": "Tell me a story.", "max_tokens": 400, "ignore_eos": True, "stream": True}
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
                text = ""
                for chunk in r.iter_text():
                    text += chunk
                    started.set()
                results.append(text)

        clients = [threading.Thread(target=stream, args=(e,)) for e in started]
        for c in clients:
            c.start()
        # Both streams in flight before SIGTERM: a request that arrives after it gets a 503 instead.
        assert all(e.wait(60) for e in started)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        for c in clients:
            c.join(60)
        assert proc.wait(30) == 0
        assert time.monotonic() - t0 < 20
        for text in results:
            events = parse_sse(text)
            assert events[-1] == "[DONE]"
            last = [e for e in events[:-1] if e["choices"]][-1]["choices"][0]
            assert last["finish_reason"] == "abort", json.dumps(events[-3:])
            assert last["stop_reason"] == "worker_shutdown"        # a gateway migrates it (worker.continuation)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.seek(0)
        out = log.read()
    assert "draining: 2 requests in flight" in out and "aborting 2 engine requests" in out, out[-2000:]
