"""The gateway against fake workers over real HTTP: passthrough, SSE, failover before the first
byte, in-flight accounting, client disconnects, bursts spread by JSQ."""

import asyncio
import json
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn

sys.path.insert(0, str(Path(__file__).parent))
from gateway_fakes import FakeWorker  # noqa: E402
from benchmarks.lib.procs import free_port  # noqa: E402

from gateway.app import build_app  # noqa: E402
from gateway.config import GatewayConfig  # noqa: E402
from gateway.connection import edge_protocol  # noqa: E402
from gateway.health import HealthPolicy  # noqa: E402

pytestmark = pytest.mark.e2e


class Gateway:
    def __init__(self, urls, **kw):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = GatewayConfig(workers=urls, port=self.port, **kw)
        self.app = build_app(cfg)
        http = edge_protocol(cfg.max_header_bytes, cfg.max_headers, cfg.header_timeout)      # as gateway.cli runs it
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    http=http))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.02)
        time.sleep(0.3)        # first scrapes

    def in_flight(self, settle: float = 3.0):
        """In-flight counts once cleanup has run (it runs just after the last byte is sent)."""
        deadline = time.time() + settle
        counts = [w.in_flight for w in self.app.state.pool]
        while any(counts) and time.time() < deadline:
            time.sleep(0.02)
            counts = [w.in_flight for w in self.app.state.pool]
        return counts

    def stop(self):
        self.server.should_exit = True
        self.thread.join(5)


@pytest.fixture
def two_workers():
    ws = [FakeWorker("a", delay=0.05).start(), FakeWorker("b", delay=0.05).start()]
    yield ws
    for w in ws:
        w.stop()


def test_passthrough_stream_and_models(two_workers):
    gw = Gateway([w.url for w in two_workers])
    try:
        r = httpx.post(gw.url + "/v1/completions", json={"model": "m", "prompt": "x"})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == "ok"
        with httpx.stream("POST", gw.url + "/v1/completions", json={"model": "m", "prompt": "x", "stream": True}) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            lines = [line for line in r.iter_lines() if line]
        assert lines[-1] == "data: [DONE]" and [json.loads(x[6:]).get("i") for x in lines[:-1]] == [0, 1, 2, None]
        assert httpx.get(gw.url + "/v1/models").json()["data"] == [{"id": "m", "object": "model"}]
        assert httpx.get(gw.url + "/health").status_code == 200
        assert gw.in_flight() == [0, 0]
        metrics = httpx.get(gw.url + "/metrics").text
        assert "swiftserve_gateway_routing_decisions_total" in metrics
        assert not any(line.startswith("vllm:") for line in metrics.splitlines())
    finally:
        gw.stop()


def test_bad_input_gets_openai_errors(two_workers):
    gw = Gateway([w.url for w in two_workers])
    try:
        r = httpx.post(gw.url + "/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 400 and "error" in r.json()
        r = httpx.post(gw.url + "/v1/chat/completions", json=[1, 2])
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    finally:
        gw.stop()


def test_failover_before_first_byte_and_503_when_none(two_workers):
    import socket

    hold = socket.socket()               # bound, never listening: connections are refused, and the
    hold.bind(("127.0.0.1", 0))          # port cannot be handed to another server of this test
    dead = f"http://127.0.0.1:{hold.getsockname()[1]}"
    gw = Gateway([dead, two_workers[0].url], scrape_interval=10)   # no scrape has ejected the dead one yet
    try:
        for _ in range(4):
            r = httpx.post(gw.url + "/v1/completions", json={"model": "m", "prompt": "x"})
            assert r.status_code == 200
        assert gw.in_flight() == [0, 0]
    finally:
        gw.stop()
    gw = Gateway([dead], health=HealthPolicy(interval=0.05))
    try:
        r = httpx.post(gw.url + "/v1/completions", json={"model": "m", "prompt": "x"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "no_worker" and "retry-after" in r.headers
        deadline = time.time() + 5
        while httpx.get(gw.url + "/health").status_code != 503 and time.time() < deadline:
            time.sleep(0.05)
        assert httpx.get(gw.url + "/health").status_code == 503
    finally:
        gw.stop()
        hold.close()


def test_client_disconnect_aborts_upstream_and_releases(two_workers):
    slow = FakeWorker("slow", delay=0.3, chunks=50).start()
    gw = Gateway([slow.url])
    try:
        with httpx.stream("POST", gw.url + "/v1/completions", json={"model": "m", "prompt": "x", "stream": True}) as r:
            it = r.iter_lines()
            next(it)
        deadline = time.time() + 5
        while (slow.active or gw.in_flight() != [0]) and time.time() < deadline:
            time.sleep(0.05)
        assert slow.active == 0 and slow.cancelled == 1 and gw.in_flight() == [0]
    finally:
        gw.stop()
        slow.stop()


def test_burst_is_spread_by_jsq_even_with_stale_metrics():
    # Both workers report an idle queue that never updates (like a lagging scrape).
    ws = [FakeWorker(n, delay=0.2).start() for n in "ab"]
    gw = Gateway([w.url for w in ws], scrape_interval=30)
    try:
        async def burst():
            async with httpx.AsyncClient(timeout=30) as c:
                rs = await asyncio.gather(*(c.post(gw.url + "/v1/completions", json={"model": "m", "prompt": "x"}) for _ in range(16)))
            return [r.json()["worker"] for r in rs]

        served = asyncio.run(burst())
        assert sorted((served.count("a"), served.count("b"))) == [8, 8]
        assert gw.in_flight() == [0, 0]
    finally:
        gw.stop()
        for w in ws:
            w.stop()


def test_5xx_before_first_byte_fails_over_and_metrics(two_workers):
    bad = FakeWorker("bad", status=500).start()
    gw = Gateway([bad.url, two_workers[0].url], policy="round_robin")
    try:
        for _ in range(4):
            with httpx.stream("POST", gw.url + "/v1/completions", json={"model": "m", "prompt": "x", "stream": True}) as r:
                assert r.status_code == 200
                assert list(r.iter_lines())[-2] == "data: [DONE]"
        assert bad.served >= 1 and two_workers[0].served == 4
        m = httpx.get(gw.url + "/metrics").text
        assert "swiftserve_gateway_retries_total" in m
        count = lambda name: float(next(l for l in m.splitlines() if l.startswith(name)).rsplit(" ", 1)[1])  # noqa: E731
        assert count("swiftserve_gateway_time_to_first_token_seconds_count") == 4
        assert count("swiftserve_gateway_time_per_output_token_seconds_count") == 4
    finally:
        gw.stop()
        bad.stop()


def test_auth_limits_and_admission_over_http(two_workers):
    slow = FakeWorker("slow", delay=0.5).start()
    gw = Gateway([slow.url], api_keys=["sk-test"], requests_per_minute=600, max_inflight_per_worker=1, max_queue=1,
                 queue_timeout=5.0, max_body_bytes=2000)
    try:
        body = {"model": "m", "prompt": "x"}
        assert httpx.post(gw.url + "/v1/completions", json=body).status_code == 401
        hdr = {"Authorization": "Bearer sk-test"}
        assert httpx.post(gw.url + "/v1/completions", json={"model": "m", "prompt": "x" * 3000}, headers=hdr).status_code == 413
        r = httpx.post(gw.url + "/v1/completions", json={"model": "m"}, headers=hdr)
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"

        async def burst():
            async with httpx.AsyncClient(timeout=30, headers=hdr) as c:
                return await asyncio.gather(*(c.post(gw.url + "/v1/completions", json=body) for _ in range(3)))

        codes = sorted(r.status_code for r in asyncio.run(burst()))
        assert codes == [200, 200, 429]          # one runs, one waits in the queue, one is refused
        assert gw.in_flight() == [0]
        assert httpx.get(gw.url + "/metrics").status_code == 200      # not protected by default
    finally:
        gw.stop()
        slow.stop()
