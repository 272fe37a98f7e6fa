"""Several models behind one gateway, with the real SmolLM2-135M-Instruct and its shipped SwiftKV
variants (13%: l=26, 50%: l=15), one worker each, started once for the module:

* a mixed pool: every request, named by a served model, lands on a worker of that model (the
  response's ``model`` and each worker's own request counter say so);
* an alias split over the original and the 13% variant: sticky per ``user`` / session header,
  both variants used, the response naming the variant that answered;
* the shadow comparison: three aliases, one per variant, each scored by the original on every
  request (greedy chat, streamed and not). The original scoring its own answers is the control
  (gap ~0, agreement 1); the 50% variant's gap must exceed the 13% variant's, which must exceed
  the control's.

The split ratio over many requests is tested on fakes (test_gateway_pools.py, test_gateway_aliases.py)
and measured over 2,000+ requests by benchmarks/gateway/pools.py."""

import re
import subprocess
import sys
import time

import httpx
import pytest
from benchmarks.lib.procs import free_port, metric_sum, stop_groups, wait_healthy

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.model]

ORIG, V13, V50 = "SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct-SwiftKV-13pct", "SmolLM2-135M-Instruct-SwiftKV"
CONFIG = f"""aliases:
  smol-split:
    targets: {{{ORIG}: 1, {V13}: 1}}
  shadow-control:
    targets: {{{ORIG}: 1}}
    shadow: {{reference: {ORIG}, fraction: 1.0, models: [{ORIG}]}}
  shadow-13:
    targets: {{{V13}: 1}}
    shadow: {{reference: {ORIG}, fraction: 1.0}}
  shadow-50:
    targets: {{{V50}: 1}}
    shadow: {{reference: {ORIG}, fraction: 1.0}}
"""
QUESTIONS = ["What is the capital of France?", "Name three primary colours.", "How many legs does a spider have?",
             "Write one sentence about the sea.", "What is 12 times 12?", "Why is the sky blue?",
             "Give a synonym for happy.", "What does a thermometer measure?"]


@pytest.fixture(scope="module")
def stack(smollm2_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pools")
    (tmp / "models.yaml").write_text(CONFIG)
    procs, workers = [], {}
    try:
        for model in (ORIG, V13, V50):
            port = free_port()
            log = open(tmp / f"{model}.log", "w+")
            procs.append((subprocess.Popen(
                [sys.executable, "-m", "worker", "--model", model, "--port", str(port), "--max-model-len", "1024",
                 "--kv-cache-memory-gb", "0.1", "--torch-threads", "1", "--log-level", "warning"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True), log))
            workers[model] = f"http://127.0.0.1:{port}"
        for (proc, log), url in zip(procs, workers.values()):
            wait_healthy(url, proc, 400, log)
        gport = free_port()
        glog = open(tmp / "gateway.log", "w+")
        gw = subprocess.Popen([sys.executable, "-m", "gateway", "--workers", ",".join(workers.values()),
                               "--port", str(gport), "--policy", "jsq", "--models-config", str(tmp / "models.yaml"),
                               "--shadow-max-rps", "50", "--shadow-max-load", "100",
                               "--shadow-max-concurrency", "32"],
                              stdout=glog, stderr=subprocess.STDOUT, start_new_session=True)
        procs.append((gw, glog))
        gateway = f"http://127.0.0.1:{gport}"
        wait_healthy(gateway, gw, 60, glog)
        yield gateway, workers
    finally:
        stop_groups([proc for proc, _ in reversed(procs)])


def _chat(client, gateway, model, question, stream=False, **extra):
    body = {"model": model, "messages": [{"role": "user", "content": question}], "max_tokens": 24,
            "temperature": 0, "stream": stream, **extra}
    if not stream:
        r = client.post(gateway + "/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        return r.json()["model"]
    with client.stream("POST", gateway + "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        models = {m for line in r.iter_lines() for m in re.findall(r'"model":\s*"([^"]+)"', line)}
    assert len(models) == 1, models
    return models.pop()


def test_every_request_lands_on_a_worker_of_its_model(stack):
    gateway, workers = stack
    before = {m: metric_sum(httpx.get(u + "/metrics").text, "vllm:request_success_total") for m, u in workers.items()}
    sent = {m: 0 for m in workers}
    with httpx.Client(timeout=120) as client:
        models = [d["id"] for d in client.get(gateway + "/v1/models").json()["data"]]
        assert sorted(models[:3]) == sorted(workers) and len(models) == len(set(models))
        for i in range(12):
            model = list(workers)[i % 3]
            body = {"model": model, "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0,
                    "stream": i % 2 == 1}
            r = client.post(gateway + "/v1/completions", json=body)
            assert r.status_code == 200 and set(re.findall(r'"model":\s*"([^"]+)"', r.text)) == {model}
            sent[model] += 1
        r = client.post(gateway + "/v1/completions", json={"model": "SmolLM2-7B", "prompt": "x"})
        assert r.status_code == 404 and ORIG in r.json()["error"]["message"]
    after = {m: metric_sum(httpx.get(u + "/metrics").text, "vllm:request_success_total") for m, u in workers.items()}
    assert {m: after[m] - before[m] for m in workers} == sent


def test_alias_split_is_sticky_and_names_the_variant(stack):
    gateway, _ = stack
    seen = set()
    with httpx.Client(timeout=120) as client:
        for user in ("ann", "bo", "cy", "di", "ed", "flo"):
            got = {_chat(client, gateway, "smol-split", "Say hi.", user=user, max_tokens=4) for _ in range(3)}
            assert len(got) == 1, (user, got)
            seen |= got
    assert seen == {ORIG, V13}


def test_shadow_gap_grows_with_the_layers_skipped(stack):
    gateway, _ = stack
    n = len(QUESTIONS)
    with httpx.Client(timeout=120) as client:
        for alias in ("shadow-control", "shadow-13", "shadow-50"):
            for i, q in enumerate(QUESTIONS):
                _chat(client, gateway, alias, q, stream=i % 2 == 0)
        deadline = time.time() + 300
        while True:
            text = client.get(gateway + "/metrics").text
            done = {m: metric_sum(text, "swiftserve_gateway_shadow_requests_total", model=m) for m in (ORIG, V13, V50)}
            if all(v >= n for v in done.values()) or time.time() > deadline:
                break
            time.sleep(1)
    scored = {m: metric_sum(text, "swiftserve_gateway_shadow_requests_total", model=m, outcome="scored")
              for m in (ORIG, V13, V50)}
    outcomes = [line for line in text.splitlines() if line.startswith("swiftserve_gateway_shadow_requests_total{")]
    assert scored == {ORIG: n, V13: n, V50: n}, outcomes
    gap = {m: metric_sum(text, "swiftserve_gateway_shadow_logprob_gap_nats_per_token_sum", model=m) / n
           for m in (ORIG, V13, V50)}
    agree = {m: metric_sum(text, "swiftserve_gateway_shadow_greedy_agreement_sum", model=m) / n for m in (ORIG, V13, V50)}
    print("gap", gap, "agreement", agree)
    assert abs(gap[ORIG]) < 0.02 and agree[ORIG] > 0.99          # the original would say what it said
    assert gap[V50] > gap[V13] > gap[ORIG]
    assert agree[V50] < agree[ORIG]
