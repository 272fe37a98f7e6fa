"""Real processes on loopback for the fault-injection tests: fault workers
(``fault_worker.py``), gateways (``python -m gateway``), and the outcome of each request.

``outcome(...)`` classifies what a client got: ``complete`` (a whole answer: JSON with
choices, or a stream whose events end with ``[DONE]`` and carry a finish reason),
``error`` (explicit: an HTTP error status with an OpenAI-style JSON body, or a stream
whose error event is followed by ``[DONE]``) or ``lost`` (anything else: a broken
transfer, a stream cut without ``[DONE]``, a 200 that is not an answer).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from benchmarks.lib.procs import free_port, wait_healthy

HERE = Path(__file__).parent


class Proc:
    def __init__(self, cmd: list[str], url: str, env: dict | None = None) -> None:
        self.cmd, self.url, self.env = cmd, url, env
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)

    def wait_ready(self, timeout: float = 30.0) -> "Proc":
        wait_healthy(self.url, self.proc, timeout, self.log)
        return self

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def restart(self) -> "Proc":
        self.kill()
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT, env=self.env)
        return self


def real_worker(model_dir, *extra: str) -> Proc:
    """The reference-engine worker on the real model as the migration tests run it (served name
    ``m``, 512-token context, one torch thread), started, not yet waited for; ``extra``: more flags."""
    port = free_port()
    return Proc([sys.executable, "-m", "worker", "--model", str(model_dir), "--port", str(port),
                 "--served-model-name", "m", "--max-model-len", "512", "--torch-threads", "1", *extra],
                f"http://127.0.0.1:{port}")


def fault_worker(name: str, port: int | None = None) -> Proc:
    port = port or free_port()
    return Proc([sys.executable, str(HERE / "fault_worker.py"), "--port", str(port), "--name", name],
                f"http://127.0.0.1:{port}").wait_ready()


def set_fault(w: Proc, **fault) -> None:
    httpx.post(w.url + "/_fault", json=fault, timeout=5).raise_for_status()


def stats(w: Proc) -> dict:
    return httpx.get(w.url + "/_stats", timeout=5).json()


def gateway(workers: list[Proc] | list[str], *args: str, port: int | None = None, routable: int | None = None) -> Proc:
    urls = [w if isinstance(w, str) else w.url for w in workers]
    port = port or free_port()
    g = Proc([sys.executable, "-m", "gateway", "--port", str(port), "--workers", ",".join(urls),
              "--health-interval", "0.2", "--log-level", "warning", *args], f"http://127.0.0.1:{port}").wait_ready()
    wait_routable(g, len(urls) if routable is None else routable)
    return g


def wait_routable(g: Proc, n: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(g.url + "/health", timeout=2).json().get("routable_workers") == n:
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.1)
    raise AssertionError(f"gateway never had {n} routable workers")


def gateway_in_flight(g: Proc, settle: float = 5.0) -> dict[str, float]:
    """Per-worker in-flight counts from the gateway's /metrics, once they reach zero (or ``settle`` s)."""
    deadline = time.monotonic() + settle
    while True:
        text = httpx.get(g.url + "/metrics", timeout=5).text
        counts = {line.split('"')[1]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                  if line.startswith("swiftserve_gateway_worker_in_flight{")}
        if not any(counts.values()) or time.monotonic() > deadline:
            return counts
        time.sleep(0.05)


def wait_idle(w: Proc, settle: float = 5.0) -> int:
    deadline = time.monotonic() + settle
    while (n := stats(w)["active"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return n


def outcome(status: int | None, body: bytes, stream: bool) -> str:
    if status is None:
        return "lost"
    try:
        if not stream or status != 200:
            obj = json.loads(body)
            if status >= 400:
                return "error" if isinstance(obj.get("error"), dict) and obj["error"].get("message") else "lost"
            return "complete" if obj.get("choices") else "lost"
        events = [e for e in body.decode().split("\n\n") if e]
        if events[-1] != "data: [DONE]":
            return "lost"
        objs = [json.loads(e[len("data: "):]) for e in events[:-1]]
        if any("error" in o for o in objs):
            return "error" if "error" in objs[-1] else "lost"
        finished = any(c.get("finish_reason") for o in objs for c in o.get("choices", []))
        return "complete" if finished else "lost"
    except (ValueError, KeyError, IndexError, AttributeError):
        return "lost"


async def request(client: httpx.AsyncClient, url: str, body: dict, first_chunk: asyncio.Event | None = None):
    """POST and read the whole answer -> (status, body bytes, outcome); transport errors are 'lost'."""
    stream = bool(body.get("stream"))
    status, data = None, b""
    try:
        async with client.stream("POST", url, json=body) as r:
            status = r.status_code
            async for chunk in r.aiter_raw():
                data += chunk
                if first_chunk is not None:
                    first_chunk.set()
    except httpx.HTTPError as exc:
        return status, data + f"\n<{type(exc).__name__}>".encode(), "lost"
    return status, data, outcome(status, data, stream)


def run_requests(coros_factory) -> list:
    async def main():
        async with httpx.AsyncClient(timeout=60) as client:
            return await coros_factory(client)
    return asyncio.run(main())


def wait_for(pred, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


__all__ = ["Proc", "fault_worker", "gateway", "real_worker", "signal"]
