"""Fault injection with real processes on loopback: a gateway process in front of fault-worker
processes that are killed (SIGKILL), stopped (SIGSTOP), slowed, made to answer 5xx or garbage,
restarted; and the gateway itself killed while the workers stay up.

Invariant checked by every test: each request ends with a complete answer or an explicit
error (``fault_support.outcome``: never ``lost``), and in-flight counters (the gateway's per
worker, the workers' own) return to zero. Each scenario's outcomes go to ``reliability_log``.
"""

import asyncio
import re
import signal
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from fault_support import (fault_worker, gateway, gateway_in_flight, request, run_requests, set_fault,  # noqa: E402
                           stats, wait_for, wait_idle, wait_routable)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
BODY = {"model": "m", "prompt": "x"}
STREAM = {**BODY, "stream": True}
BUSY = 1000        # a queue a worker reports so that JSQ avoids it while another is idle


@pytest.fixture
def procs():
    started = []
    yield started
    for p in started:
        p.kill()


def start(procs, proc):
    procs.append(proc)
    return proc


def served_by(data: bytes) -> set[str]:
    return {m.decode() for m in re.findall(rb'"worker": ?"(\w+)"', data)}


def check(reliability_log, name, results, gw, *workers):
    outcomes = [r[2] for r in results]
    reliability_log.fault(name, outcomes)
    assert "lost" not in outcomes, [r for r in results if r[2] == "lost"]
    assert not any(gateway_in_flight(gw).values())
    for w in workers:
        assert wait_idle(w) == 0
    assert "Traceback" not in gw.output()          # expected upstream failures are one warning line


def test_worker_killed_before_the_first_byte_is_retried_elsewhere(procs, reliability_log):
    a, b = start(procs, fault_worker("a")), start(procs, fault_worker("b"))
    set_fault(a, first_delay=30)
    set_fault(b, queue=BUSY)
    gw = start(procs, gateway([a, b]))

    async def scenario(client):
        tasks = [asyncio.create_task(request(client, gw.url + "/v1/completions", body)) for body in (BODY, STREAM)]
        await asyncio.to_thread(wait_for, lambda: stats(a)["active"] == 2, 20, "both requests at a")
        a.signal(signal.SIGKILL)
        return await asyncio.gather(*tasks)

    results = run_requests(scenario)
    assert [r[2] for r in results] == ["complete", "complete"]          # one normal answer each, from b
    assert served_by(results[0][1]) == served_by(results[1][1]) == {"b"}
    assert stats(b)["served"] == 2
    check(reliability_log, "killed_before_first_byte", results, gw, b)


def test_worker_killed_mid_stream_gives_an_error_event(procs, reliability_log):
    # Fault workers send no token ids, so their streams cannot migrate (gateway.migration): this is
    # the non-migratable path. Migration itself: test_gateway_migration.py.
    a, b = start(procs, fault_worker("a")), start(procs, fault_worker("b"))
    set_fault(a, token_delay=0.2, tokens=100)
    set_fault(b, queue=BUSY)
    gw = start(procs, gateway([a, b]))

    async def scenario(client):
        firsts = [asyncio.Event() for _ in range(3)]
        tasks = [asyncio.create_task(request(client, gw.url + "/v1/completions", STREAM, f)) for f in firsts]
        tasks.append(asyncio.create_task(request(client, gw.url + "/v1/completions", BODY)))
        for f in firsts:
            await asyncio.wait_for(f.wait(), 20)
        await asyncio.to_thread(wait_for, lambda: stats(a)["active"] == 4, 20, "4 requests at a")
        a.signal(signal.SIGKILL)
        return await asyncio.gather(*tasks)

    results = run_requests(scenario)
    streams, full = results[:3], results[3]
    for status, data, kind in streams:
        assert status == 200 and kind == "error", data[-300:]
        assert data.endswith(b'data: [DONE]\n\n') and b'"type": "upstream_error"' in data
    assert full[2] == "complete" and served_by(full[1]) == {"b"}     # nothing was sent yet: retried on b
    check(reliability_log, "killed_mid_stream", results, gw, b)
    # Alone, a non-streamed request whose worker dies gets a JSON error.
    c = start(procs, fault_worker("c"))
    set_fault(c, token_delay=0.3, tokens=100)
    gw2 = start(procs, gateway([c]))

    async def alone(client):
        task = asyncio.create_task(request(client, gw2.url + "/v1/completions", BODY))
        await asyncio.to_thread(wait_for, lambda: stats(c)["active"] == 1, 20, "request at c")
        c.signal(signal.SIGKILL)
        return [await task]

    results = run_requests(alone)
    assert results[0][0] == 502 and results[0][2] == "error", results
    check(reliability_log, "killed_mid_request_single_worker", results, gw2)


def test_hung_worker_timeouts_fire(procs, reliability_log):
    a, b = start(procs, fault_worker("a")), start(procs, fault_worker("b"))
    set_fault(a, mode="hang")
    set_fault(b, queue=BUSY, token_delay=0.02, tokens=20)     # a whole answer well within the timeout
    gw = start(procs, gateway([a, b], "--first-byte-timeout", "1.5"))

    async def hang_then_stop(client):
        # a accepts and never answers: the first-byte timeout fires and b answers.
        results = list(await asyncio.gather(*(request(client, gw.url + "/v1/completions", body)
                                              for body in (BODY, STREAM))))
        # b stops (SIGSTOP) mid-stream: no byte for 1.5 s ends the stream with an error event.
        set_fault(a, mode="ok", queue=BUSY)
        set_fault(b, queue=0, token_delay=0.1, tokens=100)
        await asyncio.sleep(0.5)
        first = asyncio.Event()
        task = asyncio.create_task(request(client, gw.url + "/v1/completions", STREAM, first))
        await asyncio.wait_for(first.wait(), 20)
        b.signal(signal.SIGSTOP)
        results.append(await task)
        b.signal(signal.SIGCONT)
        return results

    results = run_requests(hang_then_stop)
    assert [r[2] for r in results] == ["complete", "complete", "error"], results
    assert b'"code": "timeout"' in results[2][1]
    check(reliability_log, "hung_worker", results, gw, b)


def test_non_streamed_request_on_a_hung_worker_is_retried_after_the_stall_timeout(procs, reliability_log):
    """A worker stopped while it holds a non-streamed request (no byte sent yet) shows no sign of life
    (probes and scrapes fail): after --stall-timeout the request runs on another worker, long before
    --first-byte-timeout; a slow but live worker is waited for."""
    a, b = start(procs, fault_worker("a")), start(procs, fault_worker("b"))
    set_fault(a, first_delay=3600)
    set_fault(b, queue=BUSY)
    gw = start(procs, gateway([a, b], "--stall-timeout", "2", "--first-byte-timeout", "600"))

    async def scenario(client):
        task = asyncio.create_task(request(client, gw.url + "/v1/completions", BODY))
        await asyncio.to_thread(wait_for, lambda: stats(a)["active"] == 1, 20, "the request at a")
        await asyncio.sleep(3)                  # a answers its probes: still waited for
        assert not task.done()
        a.signal(signal.SIGSTOP)
        t0 = asyncio.get_running_loop().time()
        result = await task
        return [result], asyncio.get_running_loop().time() - t0

    try:
        results, took = run_requests(scenario)
    finally:
        a.signal(signal.SIGCONT)
    assert results[0][2] == "complete" and served_by(results[0][1]) == {"b"}, results
    assert took < 20, took
    check(reliability_log, "hung_worker_non_streamed", results, gw, b)


def test_a_client_that_leaves_releases_its_worker(procs):
    """A client that disconnects while its non-streamed request waits for the worker: the gateway cancels
    the upstream request at once (the worker aborts it) instead of waiting for an answer nobody reads."""
    a = start(procs, fault_worker("a"))
    set_fault(a, first_delay=3600)
    gw = start(procs, gateway([a]))

    async def scenario(client):
        task = asyncio.create_task(client.post(gw.url + "/v1/completions", json=BODY))
        await asyncio.to_thread(wait_for, lambda: stats(a)["active"] == 1, 20, "the request at a")
        task.cancel()                               # the client goes away
        await asyncio.gather(task, return_exceptions=True)

    run_requests(scenario)
    assert not any(gateway_in_flight(gw).values())


def test_request_faults_never_open_the_circuit(procs, reliability_log):
    """4xx answers and 5xx the worker marks as the request's own fault are passed on (not retried) and count
    neither for nor against the worker: two worker faults before them and one after open the circuit."""
    a = start(procs, fault_worker("a"))
    gw = start(procs, gateway([a], "--breaker-failures", "3", "--breaker-cooldown", "60"))
    url = gw.url + "/v1/completions"

    def send(mode, n):
        set_fault(a, mode=mode)
        return run_requests(lambda c: asyncio.gather(*(request(c, url, BODY) for _ in range(n))))

    results = send("error500", 2)                                   # two of the three failures
    faults = send("request_fault500", 8)
    assert all(r[0] == 500 and b"engine_request_failed" in r[1] for r in faults), faults
    refused = send("error400", 8)
    assert all(r[0] == 400 for r in refused), refused               # the circuit stayed closed
    assert stats(a)["served"] == 18                                 # each once: not retried
    results += faults + refused + send("error500", 1)               # the third: neither kind reset the count
    results += send("ok", 1)
    assert results[-1][0] == 503 and b"no_worker" in results[-1][1], results[-1]    # the worker's own faults do
    check(reliability_log, "request_faults_vs_worker_faults", results, gw, a)


def test_slow_worker_is_routed_around(procs, reliability_log):
    slow, fast = start(procs, fault_worker("slow")), start(procs, fault_worker("fast"))
    set_fault(slow, token_delay=0.5, tokens=4)
    set_fault(fast, token_delay=0.01, tokens=4)
    gw = start(procs, gateway([slow, fast]))

    async def scenario(client):
        tasks = []
        for _ in range(24):
            tasks.append(asyncio.create_task(request(client, gw.url + "/v1/completions", STREAM)))
            await asyncio.sleep(0.05)
        return await asyncio.gather(*tasks)

    results = run_requests(scenario)
    n_slow, n_fast = stats(slow)["served"], stats(fast)["served"]
    assert n_slow + n_fast == 24 and n_fast >= 3 * n_slow, (n_slow, n_fast)
    check(reliability_log, "slow_worker", results, gw, slow, fast)


def test_5xx_and_garbage_from_a_worker(procs, reliability_log):
    bad, good = start(procs, fault_worker("bad")), start(procs, fault_worker("good"))
    set_fault(good, queue=BUSY)
    gw = start(procs, gateway([bad, good], "--breaker-failures", "1000"))
    url = gw.url + "/v1/completions"
    results = []
    for mode in ("error500", "garbage"):
        set_fault(bad, mode=mode)
        results += run_requests(lambda c: asyncio.gather(request(c, url, BODY), request(c, url, STREAM)))
    assert [r[2] for r in results[:3]] == ["complete"] * 3          # retried on good before the first byte
    # A garbage stream (good events, then one that is not JSON) has sent bytes: the client gets
    # the good events and an error event instead of the garbage.
    assert results[3][2] == "error" and b'"code": "bad_event"' in results[3][1] and b"{not json" not in results[3][1]
    set_fault(bad, mode="no_done")                                  # a stream that just stops
    results += run_requests(lambda c: asyncio.gather(request(c, url, STREAM)))
    assert results[-1][2] == "error" and b'"code": "truncated_stream"' in results[-1][1]
    set_fault(bad, mode="die_mid_body")                             # cut mid-body: retried on good
    results += run_requests(lambda c: asyncio.gather(request(c, url, BODY)))
    assert results[-1][2] == "complete" and served_by(results[-1][1]) == {"good"}
    check(reliability_log, "5xx_and_garbage", results, gw, good)
    # With one worker and nothing to fall back on, garbage becomes a JSON 502, never the garbage.
    only = start(procs, fault_worker("only"))
    set_fault(only, mode="garbage")
    gw2 = start(procs, gateway([only]))
    alone = run_requests(lambda c: asyncio.gather(request(c, gw2.url + "/v1/completions", BODY)))
    assert alone[0][0] == 502 and alone[0][2] == "error", alone
    check(reliability_log, "garbage_single_worker", alone, gw2, only)


def test_worker_coming_back_is_readmitted(procs, reliability_log):
    a, b = start(procs, fault_worker("a")), start(procs, fault_worker("b"))
    gw = start(procs, gateway([a, b]))
    url = gw.url + "/v1/completions"
    a.kill()
    results = []
    for _ in range(3):
        results += run_requests(lambda c: asyncio.gather(*(request(c, url, STREAM) for _ in range(4))))
    assert all(r[2] == "complete" for r in results)
    wait_routable(gw, 1)
    a.restart().wait_ready()
    wait_routable(gw, 2)
    set_fault(b, queue=BUSY)
    results += run_requests(lambda c: asyncio.gather(*(request(c, url, BODY) for _ in range(4))))
    assert stats(a)["served"] >= 1                                  # re-admitted and serving again
    check(reliability_log, "worker_comes_back", results, gw, a, b)


def test_gateway_restarted_while_workers_stay_up(procs, reliability_log):
    a = start(procs, fault_worker("a"))
    set_fault(a, token_delay=0.2, tokens=100)
    gw = start(procs, gateway([a]))

    async def cut(client):
        first = asyncio.Event()
        task = asyncio.create_task(request(client, gw.url + "/v1/completions", STREAM, first))
        await asyncio.wait_for(first.wait(), 20)
        gw.signal(signal.SIGKILL)
        return await task

    lost_with_gateway = run_requests(cut)
    assert lost_with_gateway[2] == "lost"          # the gateway itself died: nobody can tell the client
    assert wait_idle(a) == 0 and stats(a)["cancelled"] == 1         # the worker noticed and stopped
    gw.restart().wait_ready()
    wait_routable(gw, 1)
    set_fault(a, token_delay=0.01, tokens=5)
    results = run_requests(lambda c: asyncio.gather(*(request(c, gw.url + "/v1/completions", b)
                                                     for b in (BODY, STREAM) * 3)))
    assert all(r[2] == "complete" for r in results)
    check(reliability_log, "gateway_restarted", results, gw, a)


@pytest.mark.model
def test_kv_pool_exhausted_preempts_and_loses_nothing(procs, reliability_log, smollm2_dir):
    """A real worker whose KV pool holds about one of the 4 requests it gets at once: the scheduler
    preempts and recomputes, and every request still ends with all its tokens."""
    import httpx
    from fault_support import Proc
    from benchmarks.lib.procs import free_port

    port = free_port()
    worker = start(procs, Proc([sys.executable, "-m", "worker", "--model", str(smollm2_dir), "--port", str(port),
                                "--served-model-name", "m", "--max-model-len", "64", "--block-size", "16",
                                "--num-kv-blocks", "5", "--torch-threads", "1", "--log-level", "warning"],
                               f"http://127.0.0.1:{port}")).wait_ready(180)
    gw = start(procs, gateway([worker.url]))
    body = {**STREAM, "prompt": "Write a long story about a dragon.", "max_tokens": 40, "ignore_eos": True,
            "temperature": 0, "stream_options": {"include_usage": True}}
    results = run_requests(lambda c: asyncio.gather(*(request(c, gw.url + "/v1/completions", body)
                                                     for _ in range(4))))
    assert all(r[2] == "complete" for r in results), results
    assert all(b'"completion_tokens":40' in r[1] for r in results)
    load = httpx.get(worker.url + "/load").json()
    assert load["num_preemptions"] > 0, load
    assert load["in_flight"] == 0 and load["kv_blocks_used"] == 0 and load["running"] == 0
    reliability_log.fault("kv_pool_exhausted", [r[2] for r in results])
    assert not any(gateway_in_flight(gw).values())
