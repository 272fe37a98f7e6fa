"""Health thresholds, circuit breaker, admission queue, auth and rate limits, discovery,
and the other routing policies: pure or in-process tests with fakes."""

import asyncio
import random
import time

import pytest

from gateway.admission import Admission, Rejected
from gateway.auth import Auth, estimate_tokens, key_id
from gateway.discovery import WorkerPool, endpoints_from_slices, read_workers_file
from gateway.health import Health, HealthPolicy
from gateway.routing.base import WorkerState
from gateway.routing.load import jsq, kv_aware, p2c


def test_burst_jsq_spreads_where_a_stale_metrics_policy_piles_up():
    """16 requests arrive within one scrape interval; every scrape says 'idle'."""
    def stale_only(ws, now, stale_after, rng):      # routes on scraped queue only, first wins ties
        return min(ws, key=lambda w: (w.waiting or 0) + (w.running or 0))

    for policy, expect in ((jsq, [8, 8]), (stale_only, [16, 0])):
        ws = [WorkerState(u, waiting=0, running=0, scraped_at=100.0) for u in "ab"]
        for _ in range(16):
            w = policy(ws, 100.05, 2.0, random.Random(0))
            w.in_flight += 1                         # dispatched, still running
        assert [w.in_flight for w in ws] == expect


def test_p2c_and_kv_policies():
    ws = [WorkerState(str(i), in_flight=i) for i in range(4)]
    picks = [p2c(ws, 0.0, 2.0, random.Random(s)).url for s in range(50)]
    assert "3" not in picks and picks.count("0") > picks.count("2")
    a = WorkerState("a", in_flight=1, waiting=0, running=1, in_flight_at_scrape=1, kv_usage=0.97, scraped_at=9.9)
    b = WorkerState("b", in_flight=2, waiting=0, running=2, in_flight_at_scrape=2, kv_usage=0.10, scraped_at=9.9)
    assert kv_aware([a, b], 10.0, 2.0, random.Random(0)) is b        # a's cache is nearly full
    c = WorkerState("c", in_flight=2, waiting=0, running=2, in_flight_at_scrape=2, kv_usage=0.50, scraped_at=9.9)
    assert kv_aware([b, c], 10.0, 2.0, random.Random(0)) is b        # equal load: emptier cache


def test_health_thresholds_do_not_flap():
    h = Health(HealthPolicy(fail_threshold=3, success_threshold=2))
    w = WorkerState("a")
    h.probe_result(w, True)                     # seen up once: thresholds apply from now on
    for ok, expect in ((False, True), (False, True), (True, True), (False, True), (False, True), (False, False),
                       (True, False), (True, True)):
        h.probe_result(w, ok)
        assert w.healthy is expect


def test_health_of_a_worker_still_starting():
    """Never seen up: the first failed probe excludes it, the first good one admits it (no
    threshold wait after model loading, which is what a freshly started stack needs)."""
    h = Health(HealthPolicy(fail_threshold=3, success_threshold=2))
    w = WorkerState("a")
    h.probe_result(w, False)
    assert w.healthy is False
    h.probe_result(w, False)
    h.probe_result(w, True)
    assert w.healthy is True
    h.probe_result(w, False)                    # now a seasoned worker: one lost probe is tolerated
    assert w.healthy is True


def test_circuit_breaker_opens_half_opens_and_closes():
    h = Health(HealthPolicy(breaker_failures=2, breaker_cooldown=10.0))
    w = WorkerState("a")
    h.on_result(w, False, now=0.0)
    assert w.routable(0.0)
    h.on_result(w, False, now=1.0)
    assert not w.routable(5.0) and w.open_until == 11.0
    assert w.routable(11.0)                     # half-open: one trial allowed
    h.on_dispatch(w, 11.0)
    assert not w.routable(11.5)                 # no second trial while the first runs
    h.on_result(w, False, now=12.0)             # trial failed: open again
    assert not w.routable(13.0) and w.routable(22.0)
    h.on_dispatch(w, 22.0)
    h.on_result(w, True, now=23.0)
    assert w.routable(23.0) and w.open_until == 0.0 and w.failures == 0


def test_admission_queue_then_429():
    async def scenario():
        adm = Admission(max_inflight_per_worker=1, max_queue=1, queue_timeout=0.5)
        w = WorkerState("a")
        workers = lambda: [w]                      # noqa: E731
        choose = lambda c: c[0]                    # noqa: E731
        got = await adm.acquire(workers, choose)
        got.in_flight += 1
        waiter = asyncio.create_task(adm.acquire(workers, choose))
        await asyncio.sleep(0.05)
        assert adm.queued == 1
        with pytest.raises(Rejected) as full:
            await adm.acquire(workers, choose)
        assert full.value.status == 429 and full.value.reason == "queue_full"
        w.in_flight -= 1
        adm.release()
        assert (await asyncio.wait_for(waiter, 1)) is w
        w.in_flight += 1
        with pytest.raises(Rejected) as late:
            await adm.acquire(workers, choose)
        assert late.value.reason == "queue_timeout"
        w.healthy = False
        with pytest.raises(Rejected) as none:
            await adm.acquire(workers, choose)
        assert none.value.status == 503

    asyncio.run(scenario())


def test_auth_and_rate_limits():
    a = Auth(["sk-one", "sk-two"], requests_per_minute=2, tokens_per_minute=1000)
    with pytest.raises(Rejected) as e:
        a.check("Bearer nope")
    assert e.value.status == 401
    who = a.check("Bearer sk-one")
    assert who == key_id("sk-one") and "sk-one" not in who
    a.charge(who, 10)
    a.charge(who, 10)
    with pytest.raises(Rejected) as e:
        a.charge(who, 10)
    assert e.value.status == 429 and e.value.reason == "rate_limit_requests" and e.value.retry_after > 0
    other = a.check("Bearer sk-two")
    a.charge(other, 990)
    with pytest.raises(Rejected) as e:
        a.charge(other, 100)
    assert e.value.reason == "rate_limit_tokens"
    assert Auth([]).check(None) == "anonymous"
    assert estimate_tokens({"prompt": [1] * 40, "max_tokens": 10}) == 50


def test_discovery_pool_and_slices(tmp_path):
    pool = WorkerPool(["http://a:1", "http://b:1"])
    pool.workers["http://b:1"].in_flight = 1
    pool.sync(["http://a:1", "http://c:1"])
    assert pool.workers["http://b:1"].draining and "http://c:1" in pool.workers
    pool.workers["http://b:1"].in_flight = 0
    pool.reap()
    assert sorted(pool.workers) == ["http://a:1", "http://c:1"]
    slices = [{"ports": [{"name": "metrics", "port": 9}, {"name": "http", "port": 8000}],
               "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": True}},
                             {"addresses": ["10.0.0.2"], "conditions": {"ready": False}},
                             {"addresses": ["10.0.0.3"], "conditions": {"ready": True, "terminating": True}},
                             {"addresses": ["fd00::4"], "conditions": {}}]}]
    assert endpoints_from_slices(slices, "http", 80) == ["http://10.0.0.1:8000", "http://[fd00::4]:8000"]
    f = tmp_path / "workers.txt"
    f.write_text("# workers\nhttp://x:1\n\nhttp://y:2  # second\n")
    assert read_workers_file(f) == ["http://x:1", "http://y:2"]
    f.write_text("workers:\n  - http://z:3\n")
    assert read_workers_file(f) == ["http://z:3"]


def test_workers_file_is_watched(tmp_path):
    from gateway.discovery import watch_file

    f = tmp_path / "w.txt"
    f.write_text("http://a:1\n")
    pool = WorkerPool([])

    async def scenario():
        task = asyncio.create_task(watch_file(str(f), pool, interval=0.02))
        await asyncio.sleep(0.1)
        assert list(pool.workers) == ["http://a:1"]
        time.sleep(0.01)
        f.write_text("http://b:1\n")
        await asyncio.sleep(0.1)
        task.cancel()
        assert list(pool.workers) == ["http://b:1"]

    asyncio.run(scenario())
