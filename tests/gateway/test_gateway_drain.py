"""gateway.shutdown with real processes: on SIGTERM the gateway refuses new requests (503
shutting_down), reports 503 on /health, lets the stream in flight finish, then exits 0."""

import asyncio
import signal
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from fault_support import fault_worker, gateway, request, run_requests, set_fault  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_sigterm_drains_the_gateway():
    w = fault_worker("a")
    gw = None
    try:
        set_fault(w, token_delay=0.1, tokens=15)                 # a stream of about 1.5 s
        gw = gateway([w], "--drain-timeout", "20")

        async def scenario(client):
            first = asyncio.Event()
            task = asyncio.create_task(request(client, gw.url + "/v1/completions",
                                               {"model": "m", "prompt": "x", "stream": True}, first))
            await asyncio.wait_for(first.wait(), 20)
            gw.signal(signal.SIGTERM)
            await asyncio.sleep(0.3)
            refused = await client.post(gw.url + "/v1/completions", json={"model": "m", "prompt": "x"})
            health = await client.get(gw.url + "/health")
            return await task, refused, health

        (status, data, kind), refused, health = run_requests(scenario)
        assert status == 200 and kind == "complete", data[-300:]
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
        assert refused.headers["retry-after"] == "1"
        assert health.status_code == 503 and health.json()["status"] == "draining"
        assert gw.proc.wait(20) == 0                               # drained: nothing left in flight
    finally:
        w.kill()
        if gw is not None:
            gw.kill()
