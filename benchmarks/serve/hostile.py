"""Hostile input against a real stack, measured (issue 47).

    python -m benchmarks serve hostile --out results/reliability/hostile.json

Starts ``swiftserve up --workers 1`` (SmolLM2-135M-Instruct on the reference engine, a gateway in
front, the supervisor that restarts whatever exits), with every limit at its default, and runs
four parts against it:

1. **hostile**: ``--cases`` requests drawn (derandomised) from ``benchmarks/lib/fuzz.py``: the
   Hypothesis bodies (every field of completions, chat and Responses with values of every JSON
   type, raw bytes), each family of the structured surface (output constraints, tools, Responses
   items, scoring fields), plus the fixed hostile cases and issue 47's regressions, sent through
   the gateway ``--concurrency`` at a time. ``hostile_5xx`` counts the answers that were not the
   client's fault: a 5xx, a broken connection, no answer in ``--timeout`` s, or a stream whose
   in-band error is an engine or transport error. ``hostile_engine_deaths`` counts the times the
   worker's engine process was replaced (it died and the worker or its supervisor restarted).
2. **latency**: a normal request (chat, 8 greedy tokens) in a loop, first alone, then while
   issue 47's regressions are sent one after another, ``--rounds`` times (their bodies serialised
   before the timing starts, so that the client's own JSON work is not counted);
   ``max_concurrent_latency_ms_under_hostile`` is the worst latency of a normal request that
   overlapped a hostile one (the alone figures are reported beside it).
3. **dead engine**: SIGKILL of the worker's engine process, ``--deaths`` times;
   ``dead_engine_recovered_s`` is the worst time from the kill to the worker's ``/health`` 200
   again (the worker exits with status 3, the supervisor starts it: 1, 2, 4 s backoff).
4. **slow headers**: ``--slow-connections`` connections to the gateway that send a header line
   every second and never finish their headers; ``slow_header_connections_closed_s`` is the
   worst time until the gateway closed one (its ``--header-timeout``, 10 s by default).

Writes ``--out`` with the details and ``figures`` (the four summary keys plus
``hostile_cases``), which ``benchmarks/report/reliability.py`` merges into ``summary.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.lib.procs import free_port, stop_groups
from benchmarks.lib.records import write_json

NOT_THE_CLIENTS = ("engine_error", "engine_unavailable", "engine_request_failed", "internal_error", "bad_event",
                   "truncated_stream", "timeout", "response_too_large", "upstream_error", "stalled")
NORMAL = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8, "temperature": 0}


# ---- the stack ----------------------------------------------------------------------------------
class Stack:
    def __init__(self, gw_port: int, worker_port: int, log: Path) -> None:
        self.gw, self.worker = f"http://127.0.0.1:{gw_port}", f"http://127.0.0.1:{worker_port}"
        self.log = open(log, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "swiftserve", "up", "--workers", "1",
                                      "--port", str(gw_port), "--worker-base-port", str(worker_port)],
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 900
        while not self.routable():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the stack did not start (see {log})")
            time.sleep(1)
        self.model = httpx.get(self.gw + "/v1/models", timeout=10).json()["data"][0]["id"]

    def routable(self) -> bool:
        try:
            return (httpx.get(self.gw + "/health", timeout=2).json().get("routable_workers") == 1
                    and bool(httpx.get(self.gw + "/v1/models", timeout=10).json()["data"]))
        except (httpx.HTTPError, ValueError, KeyError):
            return False

    def worker_healthy(self) -> bool:
        try:
            return httpx.get(self.worker + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def engine_pid(self) -> int | None:
        """The worker's engine process (the worker's ``multiprocessing`` child), None while there is none."""
        import psutil

        try:
            for p in psutil.Process(self.proc.pid).children(recursive=True):
                if "spawn_main" in " ".join(p.cmdline()):
                    return p.pid
        except psutil.Error:
            pass
        return None

    def stop(self) -> None:
        stop_groups([self.proc], 60)
        self.log.close()


# ---- part 1: hostile cases ----------------------------------------------------------------------
def draw_cases(n: int) -> list[tuple[str, bytes]]:
    from benchmarks.lib.fuzz import family_bodies, fixed_cases, hostile_bodies, regressions
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    drawn: list[tuple[str, bytes]] = []

    @settings(max_examples=n, database=None, deadline=None, derandomize=True, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(st.one_of(hostile_bodies(), family_bodies()))
    def collect(case):
        drawn.append(case)

    collect()
    fixed = [(p, raw) for p, raw, h in fixed_cases(8 << 20) if not h] + \
        [(p, json.dumps(b).encode()) for p, b in regressions()]
    return (fixed + drawn)[:max(n, len(fixed))]


LENGTH_KEYS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


def tame(raw: bytes, model: str, path: str = "") -> bytes:
    """The served model's name for the fuzz suite's, and at most 16 generated tokens where a case asks
    for a valid larger number, none or null (chat's and Responses' default, and completions' for null, is
    the rest of the context: four such streams took 10 minutes here, and an answer that takes longer than
    ``--timeout`` counts as the stack's fault), so that 10,000 cases take minutes, not hours; everything
    else as drawn."""
    raw = raw.replace(b'"fake-model"', json.dumps(model).encode())
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        return raw
    if not isinstance(body, dict):
        return raw
    changed = False
    for key in LENGTH_KEYS:
        v = body.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and 16 < v < 2**31:
            body[key], changed = 16, True
    if all(body.get(k) is None for k in LENGTH_KEYS) and path.endswith(("/completions", "/responses")):
        body["max_output_tokens" if path.endswith("/responses") else "max_tokens"], changed = 16, True
    return json.dumps(body, allow_nan=True).encode("utf-8", "surrogatepass") if changed else raw


def verdict(status: int | None, body: bytes) -> str:
    """'ok' (an answer or the client's error) or 'server' (the stack's fault)."""
    if status is None or status >= 500:
        return "server"
    if status == 200 and b'"error"' in body:
        for code in NOT_THE_CLIENTS:
            if f'"code":"{code}"'.encode() in body or f'"code": "{code}"'.encode() in body:
                return "server"
    return "ok"


async def send_all(stack: Stack, cases, concurrency: int, timeout: float) -> dict:
    statuses: dict[str, int] = {}
    server, examples = 0, []
    queue: asyncio.Queue = asyncio.Queue()
    for c in cases:
        queue.put_nowait(c)
    done = 0
    t0 = time.monotonic()

    async def one(client, path, raw):
        nonlocal server, done
        status, body = None, b""
        try:
            async with client.stream("POST", stack.gw + path, content=raw,
                                     headers={"content-type": "application/json"}) as r:
                status = r.status_code
                async for chunk in r.aiter_raw():
                    body += chunk
        except (httpx.HTTPError, asyncio.TimeoutError) as exc:
            body = type(exc).__name__.encode()
        key = str(status) if status is not None else body.decode()
        statuses[key] = statuses.get(key, 0) + 1
        if verdict(status, body) == "server":
            server += 1
            if len(examples) < 20:
                examples.append({"path": path, "status": status, "request": raw[:300].decode("utf-8", "replace"),
                                 "answer": body[-300:].decode("utf-8", "replace")})
                print(f"  server error: {json.dumps(examples[-1])}", flush=True)
        done += 1
        if done % 500 == 0:
            print(f"  {done}/{len(cases)} cases, {server} server errors, {time.monotonic() - t0:.0f} s", flush=True)

    async def runner(client):
        while not queue.empty():
            path, raw = queue.get_nowait()
            await one(client, path, tame(raw, stack.model, path))

    async with httpx.AsyncClient(timeout=timeout) as client:
        await asyncio.gather(*(runner(client) for _ in range(concurrency)))
    return {"cases": len(cases), "statuses": dict(sorted(statuses.items())), "server_errors": server,
            "server_error_examples": examples, "seconds": round(time.monotonic() - t0, 1)}


class EngineWatch:
    """Counts the engine processes the worker had (a new pid after the first: an engine death)."""

    def __init__(self, stack: Stack) -> None:
        self.stack, self.pids, self.unhealthy = stack, [], 0

    async def run(self) -> None:
        while True:
            pid = await asyncio.to_thread(self.stack.engine_pid)
            if pid is not None and (not self.pids or self.pids[-1] != pid):
                self.pids.append(pid)
            if not await asyncio.to_thread(self.stack.worker_healthy):
                self.unhealthy += 1
            await asyncio.sleep(0.5)

    @property
    def deaths(self) -> int:
        return max(0, len(self.pids) - 1)


# ---- part 2: latency of a normal request beside hostile ones ------------------------------------
async def latency_timeline(stack: Stack, alone: int, rounds: int, timeout: float) -> tuple[list, list, list]:
    """(alone, beside, hostile): (start, end, status) of the normal requests measured alone and of
    those sent while the regressions ran; (start, end, status, body bytes) of each regression."""
    from benchmarks.lib.fuzz import regressions

    body = {"model": stack.model, **NORMAL}
    # Serialised before anything is timed: building them (multi-MB JSON) takes this process's event loop
    # about a second per round, which the normal requests timed on the same loop would count.
    bodies = [(path, tame(json.dumps(case).encode(), stack.model, path)) for path, case in regressions()]
    async with httpx.AsyncClient(timeout=timeout) as client:
        async def normal() -> tuple[float, float, int]:
            t = time.monotonic()
            r = await client.post(stack.gw + "/v1/chat/completions", json=body)
            return t, time.monotonic(), r.status_code

        solo = [await normal() for _ in range(alone)]
        hostile: list[tuple[float, float, int, int]] = []
        beside: list[tuple[float, float, int]] = []
        stop = asyncio.Event()

        async def normals():
            while not stop.is_set():
                beside.append(await normal())

        async def hostiles():
            for _ in range(rounds):
                for path, raw in bodies:
                    t = time.monotonic()
                    r = await client.post(stack.gw + path, content=raw, headers={"content-type": "application/json"})
                    hostile.append((t, time.monotonic(), r.status_code, len(raw)))
            stop.set()

        await asyncio.gather(normals(), hostiles())
    return solo, beside, hostile


async def normal_latency(stack: Stack, alone: int, rounds: int, timeout: float) -> dict:
    solo, beside, hostile = await latency_timeline(stack, alone, rounds, timeout)
    ms = [1e3 * (e - s) for s, e, _ in solo]
    overlapping = [1e3 * (e - s) for s, e, _ in beside if any(s < he and e > hs for hs, he, *_ in hostile)]
    return {"alone_median_ms": round(statistics.median(ms), 1), "alone_max_ms": round(max(ms), 1),
            "beside_hostile": len(overlapping), "beside_median_ms": round(statistics.median(overlapping), 1),
            "beside_max_ms": round(max(overlapping), 1),
            "normal_statuses": sorted({c for *_, c in solo + beside}),
            "hostile_requests": len(hostile), "hostile_statuses": sorted({c for _, _, c, _ in hostile}),
            "hostile_max_ms": round(max(1e3 * (e - s) for s, e, *_ in hostile), 1)}


# ---- part 3: a dead engine --------------------------------------------------------------------------
def dead_engine(stack: Stack, deaths: int) -> dict:
    times = []
    for _ in range(deaths):
        pid = stack.engine_pid()
        t0 = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        # a new engine (not the killed one, nor none while the worker restarts) and a healthy worker: the
        # killed worker may answer /health for a moment before it exits
        while stack.engine_pid() in (None, pid) or not stack.worker_healthy():
            if time.monotonic() - t0 > 300:
                raise SystemExit("the worker did not come back within 300 s")
            time.sleep(0.2)
        times.append(round(time.monotonic() - t0, 1))
        while not stack.routable():
            time.sleep(0.2)
        r = httpx.post(stack.gw + "/v1/chat/completions", json={"model": stack.model, **NORMAL}, timeout=120)
        assert r.status_code == 200, r.text
        print(f"  engine killed: healthy again after {times[-1]} s", flush=True)
    return {"recovered_s": times}


# ---- part 4: slow headers -------------------------------------------------------------------------
async def slow_headers(stack: Stack, n: int) -> dict:
    host, port = stack.gw.removeprefix("http://").split(":")

    async def one() -> float:
        reader, writer = await asyncio.open_connection(host, int(port))
        t0 = time.monotonic()
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        try:
            while time.monotonic() - t0 < 300:
                try:
                    data = await asyncio.wait_for(reader.read(4096), 1.0)
                    if not data:
                        break
                    continue                     # the 408: read until the gateway closes
                except asyncio.TimeoutError:
                    writer.write(b"X-Slow: 1\r\n")
                    await writer.drain()
        except (ConnectionError, OSError):
            pass
        writer.close()
        return time.monotonic() - t0

    closed = await asyncio.gather(*(one() for _ in range(n)))
    return {"connections": n, "closed_after_s": [round(x, 1) for x in closed]}


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", default="results/reliability/hostile.json")
    ap.add_argument("--cases", type=int, default=10_000)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds for one answer")
    ap.add_argument("--alone", type=int, default=20, help="normal requests measured alone")
    ap.add_argument("--rounds", type=int, default=3, help="times the regressions are sent beside normal requests")
    ap.add_argument("--deaths", type=int, default=3)
    ap.add_argument("--slow-connections", type=int, default=20)


def main(args: argparse.Namespace) -> int:
    base = free_port(2)
    log = Path(tempfile.gettempdir()) / f"hostile-stack-{base}.log"
    print(f"drawing {args.cases} cases", flush=True)
    cases = draw_cases(args.cases)
    print(f"starting the stack (log: {log})", flush=True)
    stack = Stack(base, base + 1, log)
    try:
        async def fuzz():
            watch = EngineWatch(stack)
            task = asyncio.create_task(watch.run())
            await asyncio.sleep(1)
            result = await send_all(stack, cases, args.concurrency, args.timeout)
            await asyncio.sleep(2)
            task.cancel()
            return {**result, "engine_pids": len(watch.pids), "engine_deaths": watch.deaths,
                    "worker_unhealthy_polls": watch.unhealthy}

        print("part 1: hostile cases", flush=True)
        hostile = asyncio.run(fuzz())
        print(json.dumps({k: v for k, v in hostile.items() if k != "server_error_examples"}), flush=True)
        print("part 2: latency beside hostile requests", flush=True)
        latency = asyncio.run(normal_latency(stack, args.alone, args.rounds, args.timeout))
        print(json.dumps(latency), flush=True)
        print("part 4: slow headers", flush=True)
        slow = asyncio.run(slow_headers(stack, args.slow_connections))
        print(json.dumps(slow), flush=True)
        print("part 3: dead engine", flush=True)
        dead = dead_engine(stack, args.deaths)
    finally:
        stack.stop()
    figures = {"hostile_cases": hostile["cases"], "hostile_5xx": hostile["server_errors"],
               "hostile_engine_deaths": hostile["engine_deaths"],
               "max_concurrent_latency_ms_under_hostile": latency["beside_max_ms"],
               "dead_engine_recovered_s": max(dead["recovered_s"]),
               "slow_header_connections_closed_s": max(slow["closed_after_s"])}
    write_json(args.out, {"command": args.command, "figures": figures, "hostile": hostile, "latency": latency,
                          "dead_engine": dead, "slow_headers": slow})
    print(json.dumps(figures, indent=1))
    return 0
