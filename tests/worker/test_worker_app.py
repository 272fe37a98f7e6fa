"""Service endpoints, metrics (exact vLLM names, per-app registries), lifespan,
admission limits and in-band stream errors."""

import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from worker_test_fakes import FakeEngineClient, make_tokenizer, parse_sse

VLLM_NAMES = {
    "vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge", "vllm:gpu_cache_usage_perc": "gauge",
    "vllm:time_to_first_token_seconds": "histogram", "vllm:inter_token_latency_seconds": "histogram",
    "vllm:request_time_per_output_token_seconds": "histogram", "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram", "vllm:request_prefill_time_seconds": "histogram",
    "vllm:prompt_tokens_total": "counter", "vllm:generation_tokens_total": "counter",
    "vllm:request_success_total": "counter",
    "vllm:prefix_cache_queries_total": "counter", "vllm:prefix_cache_hits_total": "counter",
}


def samples(text):
    """{(sample name, frozenset(labels)) : value}"""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(smp, name, **labels):
    labels = {"model_name": "fake-model", "engine": "0", **labels}
    return smp[(name, frozenset(labels.items()))]


def test_lifespan_starts_and_stops_the_engine(client_for, make_app):
    from fastapi.testclient import TestClient

    app, engine = make_app()
    with TestClient(app):
        assert engine.started and not engine.stopped
    assert engine.stopped


def test_models_health_load_version(client_for):
    client, engine = client_for()
    models = client.get("/v1/models").json()
    assert models["object"] == "list"
    (m,) = models["data"]
    assert m["id"] == "fake-model" and m["object"] == "model" and m["max_model_len"] == 256
    assert {"created", "owned_by", "root"} <= set(m)
    assert client.get("/health").status_code == 200
    load = client.get("/load").json()
    assert (load["running"], load["waiting"], load["in_flight"], load["kv_usage"]) == (1, 2, 0, 0.25)
    assert load["server_load"] == 0                      # vLLM's /load field
    (rank,) = client.get("/get_load").json()             # what SGLang-style routers poll
    assert rank["dp_rank"] == 0 and (rank["num_reqs"], rank["num_waiting_reqs"]) == (3, 2)
    assert rank["num_tokens"] == 25 * engine.stats().kv_block_size
    v = client.get("/version").json()
    assert v["version"] and v["engine"] == "reference"


def test_metric_names_are_exactly_vllms(client):
    client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 5})
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    for name, kind in VLLM_NAMES.items():
        assert f"# TYPE {name} {kind}" in text, name
    names = {s[0] for s in samples(text)}
    assert "vllm:prompt_tokens_total" in names and "vllm:request_success_total" in names
    assert not any(n.endswith("_total_total") for n in names)


def test_metric_values_after_requests(client):
    n_prompt = len(make_tokenizer().encode("Hello", add_special_tokens=False))
    client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 5})
    client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 3, "stream": True})
    smp = samples(client.get("/metrics").text)
    assert value(smp, "vllm:prompt_tokens_total") == 2 * n_prompt
    assert value(smp, "vllm:generation_tokens_total") == 8
    assert value(smp, "vllm:request_success_total", finished_reason="length") == 2
    assert value(smp, "vllm:time_to_first_token_seconds_count") == 2
    assert value(smp, "vllm:inter_token_latency_seconds_count") == 4 + 2
    assert value(smp, "vllm:e2e_request_latency_seconds_count") == 2
    assert value(smp, "vllm:request_time_per_output_token_seconds_count") == 2
    assert value(smp, "vllm:request_queue_time_seconds_count") == 2
    assert value(smp, "vllm:request_prefill_time_seconds_count") == 2
    # Engine gauges come from engine.stats() at scrape time.
    assert value(smp, "vllm:num_requests_running") == 1
    assert value(smp, "vllm:num_requests_waiting") == 2
    assert value(smp, "vllm:kv_cache_usage_perc") == 0.25 == value(smp, "vllm:gpu_cache_usage_perc")
    assert value(smp, "swiftserve_worker_kv_bytes_per_token") == 1024
    assert value(smp, "swiftserve_worker_kv_bytes_per_token_baseline") == 2048
    assert value(smp, "swiftserve_worker_kv_compression_ratio") == 2.0
    assert value(smp, "swiftserve_worker_kv_blocks_total") == 100
    assert value(smp, "swiftserve_worker_kv_blocks_used") == 25
    assert value(smp, "swiftserve_worker_kv_bytes_total") == 1 << 20
    assert value(smp, "swiftserve_worker_preemptions_total") == 3
    assert value(smp, "swiftserve_worker_swiftkv_layers") == 15
    # an extra figure named *_total is a counter (the exposition keeps one _total)
    text = client.get("/metrics").text
    assert "# TYPE swiftserve_worker_swiftkv_unnarrowed_tail_rows_total counter" in text
    assert value(smp, "swiftserve_worker_swiftkv_unnarrowed_tail_rows_total") == 7
    info = {k: v for k, v in smp.items() if k[0] == "vllm:cache_config_info"}
    ((_, labels), v), = info.items()
    assert v == 1 and dict(labels)["num_gpu_blocks"] == "100" and dict(labels)["block_size"].isdigit()
    assert dict(labels)["enable_prefix_caching"] == "True"
    # prefix cache: vLLM's counters, in tokens (the gateway's prefix policy reads them)
    assert value(smp, "vllm:prefix_cache_queries_total") == 1000
    assert value(smp, "vllm:prefix_cache_hits_total") == 640


def test_gauges_follow_the_engine_at_scrape_time(client_for):
    client, engine = client_for()
    engine.stats_value.num_waiting = 17
    engine.stats_value.extra["zack_rate"] = 0.5
    smp = samples(client.get("/metrics").text)
    assert value(smp, "vllm:num_requests_waiting") == 17
    assert value(smp, "swiftserve_worker_zack_rate") == 0.5


def test_two_apps_in_one_process_do_not_collide(client_for):
    a, _ = client_for()
    b, _ = client_for(served_model_name=("other",))
    a.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 2})
    sa, sb = samples(a.get("/metrics").text), samples(b.get("/metrics").text)
    assert value(sa, "vllm:generation_tokens_total") == 2
    assert sb[("vllm:generation_tokens_total", frozenset({"model_name": "other", "engine": "0"}.items()))] == 0


def test_mid_stream_engine_failure_is_reported_in_band(client_for):
    client, _ = client_for(FakeEngineClient(fail_after=2))
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                 "max_tokens": 10, "stream": True})
    events = parse_sse(r.text)
    assert events[-1] == "[DONE]"
    assert set(events[-2]) == {"error"} and events[-2]["error"]["message"]


@pytest.mark.parametrize("status", [429, 503])
def test_concurrency_limit_refuses_at_once(serve, status):
    srv, engine = serve(FakeEngineClient(token_delay=0.05), max_concurrent_requests=1, overload_status=status)
    started = threading.Event()

    def long_request():
        with httpx.stream("POST", srv.url + "/v1/completions",
                          json={"prompt": "x", "max_tokens": 20, "stream": True}, timeout=30) as r:
            for _ in r.iter_lines():
                started.set()

    t = threading.Thread(target=long_request)
    t.start()
    assert started.wait(10)
    assert httpx.get(srv.url + "/load").json()["in_flight"] == 1
    r = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}, timeout=10)
    assert r.status_code == status and r.json()["error"]["message"]
    assert r.headers.get("retry-after") == "1"
    t.join(30)
    deadline = time.monotonic() + 5
    while httpx.get(srv.url + "/load").json()["in_flight"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert httpx.get(srv.url + "/load").json()["in_flight"] == 0
    assert httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}).status_code == 200
