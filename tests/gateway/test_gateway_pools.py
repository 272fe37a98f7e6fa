"""Model-aware pools and weighted splits, over real HTTP with fake workers that serve one model each
(a worker refuses other names with a 404, as real workers do): every request lands on a worker of
its model, retries stay in the pool, unknown models are a 404 naming the served ones, ``/v1/models``
lists each model once, an alias splits by weight (sticky per session header or ``user``), a models
file is re-read without a restart, and the metrics carry the model."""

import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from gateway_fakes import FakeWorker  # noqa: E402
from test_gateway_proxy import Gateway  # noqa: E402

from gateway.aliases import parse_alias_flag  # noqa: E402
from gateway.health import HealthPolicy  # noqa: E402


@pytest.fixture(scope="module")
def workers():
    ws = [FakeWorker("a", model="orig").start(), FakeWorker("b", model="fast").start(),
          FakeWorker("c", model="fast").start()]
    yield ws
    for w in ws:
        w.stop()


@pytest.fixture
def fresh(workers):
    for w in workers:
        w.requests.clear()
    return workers


def _post(gw, model, headers=None, **kw):
    return httpx.post(gw.url + "/v1/completions", json={"model": model, "prompt": "x", **kw}, headers=headers,
                      timeout=30)


def test_each_request_lands_on_a_worker_of_its_model(fresh):
    a, b, c = fresh
    gw = Gateway([w.url for w in fresh], policy="jsq")
    try:
        for i in range(30):
            model = ("orig", "fast")[i % 2]
            r = _post(gw, model, stream=bool(i % 3 == 0))
            assert r.status_code == 200, r.text
        assert a.requests == ["orig"] * 15
        assert sorted(b.requests + c.requests) == ["fast"] * 15 and b.requests and c.requests
        data = httpx.get(gw.url + "/v1/models").json()["data"]
        assert [d["id"] for d in data] == ["fast", "orig"]                      # each model once
        r = _post(gw, "nope")
        assert r.status_code == 404
        err = r.json()["error"]
        assert err["code"] == "model_not_found" and err["param"] == "model"
        assert "orig" in err["message"] and "fast" in err["message"]
        metrics = httpx.get(gw.url + "/metrics").text
        assert 'swiftserve_gateway_requests_total{endpoint="completions",model="orig",status="200"} 15.0' in metrics
        assert f'swiftserve_gateway_worker_model{{model="fast",worker="{b.url}"}} 1.0' in metrics
        assert 'model="nope"' not in metrics                                    # labels only for served names
    finally:
        gw.stop()


def test_models_are_listed_as_soon_as_health_says_ok():
    # The model refresh runs every health interval; a worker that came up since the last one (here:
    # after the gateway, as a loading worker does) is asked at once, so a client that saw /health 200
    # never reads an empty /v1/models.
    late = FakeWorker("late", model="orig")
    gw = Gateway([late.url], health=HealthPolicy(interval=5.0))
    late.start()
    try:
        deadline = time.time() + 10
        while httpx.get(gw.url + "/health").status_code != 200:
            assert time.time() < deadline
            time.sleep(0.05)
        assert [d["id"] for d in httpx.get(gw.url + "/v1/models").json()["data"]] == ["orig"]
    finally:
        gw.stop()
        late.stop()


def test_retries_stay_in_the_pool():
    bad = FakeWorker("bad", model="fast", status=500).start()
    good, other = FakeWorker("good", model="fast").start(), FakeWorker("other", model="orig").start()
    gw = Gateway([bad.url, good.url, other.url], policy="round_robin", max_attempts=3,
                 health=HealthPolicy(breaker_failures=100))
    try:
        for _ in range(6):
            assert _post(gw, "fast").status_code == 200
        assert other.requests == [] and good.served == 6 and bad.served >= 1
    finally:
        gw.stop()
        for w in (bad, good, other):
            w.stop()


def test_alias_splits_by_weight_and_sticks_to_a_key(fresh):
    split = parse_alias_flag("public=orig:3,fast:1")
    gw = Gateway([w.url for w in fresh], policy="jsq", aliases=[split])
    try:
        seen = Counter()
        with httpx.Client(timeout=30) as client:
            for i in range(160):
                r = client.post(gw.url + "/v1/completions", json={"model": "public", "prompt": "x", "user": f"u{i}"})
                assert r.status_code == 200
                seen[r.json()["model"]] += 1        # the response says which variant answered
        assert abs(seen["orig"] / 160 - 0.75) < 0.08, seen      # the ratio itself: test_gateway_aliases.py
        for key in ("alice", "bob", "carol"):
            got = {_post(gw, "public", headers={"x-session-id": key}).json()["model"] for _ in range(8)}
            assert len(got) == 1, (key, got)        # one conversation, one variant
            assert {_post(gw, "public", user=key).json()["model"] for _ in range(4)} == got
        assert [d["id"] for d in httpx.get(gw.url + "/v1/models").json()["data"]] == ["fast", "orig", "public"]
        metrics = httpx.get(gw.url + "/metrics").text
        assert 'swiftserve_gateway_split_requests_total{alias="public",model="fast"}' in metrics
    finally:
        gw.stop()


def test_models_file_reloads_and_an_alias_may_shadow_a_served_name(fresh, tmp_path):
    cfg = tmp_path / "models.yaml"
    cfg.write_text("aliases:\n  orig:\n    targets: {orig: 1, fast: 0}\n")
    gw = Gateway([w.url for w in fresh], policy="jsq", models_config=str(cfg))
    try:
        assert {_post(gw, "orig").json()["model"] for _ in range(5)} == {"orig"}
        cfg.write_text("aliases:\n  orig:\n    targets: {orig: 0, fast: 1}\n")
        deadline = time.time() + 10
        while _post(gw, "orig").json()["model"] != "fast" and time.time() < deadline:
            time.sleep(0.2)
        assert {_post(gw, "orig").json()["model"] for _ in range(5)} == {"fast"}
        cfg.write_text("aliases:\n  orig:\n    targets: {}\n")            # refused: the table stays
        time.sleep(2.5)
        assert {_post(gw, "orig").json()["model"] for _ in range(3)} == {"fast"}
    finally:
        gw.stop()


def test_a_worker_that_changes_model_changes_pool():
    w = FakeWorker("w", model="one").start()
    gw = Gateway([w.url], policy="jsq", health=HealthPolicy(interval=0.1))
    try:
        assert _post(gw, "one").status_code == 200
        w.model = "two"                         # restarted with another model, same address
        r = _post(gw, "two")                    # before or after the refresh: never a wrong-model answer
        assert r.status_code == 200 and r.json()["model"] == "two"
        time.sleep(0.5)
        assert _post(gw, "one").status_code == 404
    finally:
        gw.stop()
    gw = Gateway([w.url], policy="jsq", health=HealthPolicy(interval=30))      # no periodic refresh meanwhile
    try:
        assert _post(gw, "two").status_code == 200
        w.model = "three"
        r = _post(gw, "two")                    # the worker's own 404: the gateway looks again, then answers
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        assert "three" in r.json()["error"]["message"]
        assert _post(gw, "three").json()["model"] == "three"
    finally:
        gw.stop()
        w.stop()


def test_tokenizer_routes_need_a_model_with_several_served(fresh):
    gw = Gateway([w.url for w in fresh], policy="jsq")
    try:
        r = httpx.post(gw.url + "/tokenize", json={"prompt": "hi"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "model_required"
        assert "orig" in r.json()["error"]["message"]
    finally:
        gw.stop()


def test_a_saturated_pool_does_not_hold_up_another():
    slow = FakeWorker("slow", model="big", delay=1.5).start()
    quick = FakeWorker("quick", model="small").start()
    gw = Gateway([slow.url, quick.url], policy="jsq", max_inflight_per_worker=1, queue_timeout=10)
    try:
        import threading

        hold = threading.Thread(target=lambda: [_post(gw, "big") for _ in range(2)])
        hold.start()
        time.sleep(0.3)                         # "big" is saturated and a second request for it waits
        waiter = threading.Thread(target=lambda: _post(gw, "big"))
        waiter.start()
        time.sleep(0.2)
        t0 = time.time()
        assert _post(gw, "small").status_code == 200
        assert time.time() - t0 < 1.0           # not queued behind the other pool
        hold.join()
        waiter.join()
    finally:
        gw.stop()
        slow.stop()
        quick.stop()


def test_constrained_answers_are_checked_per_model():
    good, bad = FakeWorker("g", model="good", text='{"a": 1}').start(), FakeWorker("b", model="bad", text='{"a"').start()
    gw = Gateway([good.url, bad.url], policy="jsq")
    try:
        for model in ("good", "bad"):
            assert _post(gw, model, response_format={"type": "json_object"}).status_code == 200
        metrics = httpx.get(gw.url + "/metrics").text
        assert 'swiftserve_gateway_constrained_outputs_total{model="good",valid="true"} 1.0' in metrics
        assert 'swiftserve_gateway_constrained_outputs_total{model="bad",valid="false"} 1.0' in metrics
    finally:
        gw.stop()
        good.stop()
        bad.stop()
