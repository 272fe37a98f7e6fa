"""Every metric the deployment relies on exists: a real worker (SmolLM2) and a gateway are
started, serve a streaming and a non-streaming request, and both /metrics are scraped.
Each metric name in every Grafana dashboard expression, in the prometheus-adapter rule
behind the HPA and in the KEDA query must be in that output (histograms as
``_bucket/_sum/_count``, counters as ``_total``)."""

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
import yaml
from deploy_support import K8S, ROOT, exposed_names, promql_metrics
from benchmarks.lib.procs import free_port, wait_healthy

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.model]


def referenced_metrics() -> dict[str, set[str]]:
    """{metric name: where it is used}."""
    uses: dict[str, set[str]] = {}
    for path in sorted((ROOT / "deploy/grafana/dashboards").glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            for t in panel["targets"]:
                for m in promql_metrics(t["expr"]):
                    uses.setdefault(m, set()).add(f"{path.name}: {panel['title']}")
    adapter = yaml.safe_load((K8S / "prometheus-adapter/values.yaml").read_text())["rules"]["custom"]
    for rule in adapter:
        for q in (rule["seriesQuery"], rule["metricsQuery"]):
            for m in promql_metrics(q.replace("<<.Series>>", "")):
                uses.setdefault(m, set()).add("prometheus-adapter rule (HPA)")
    keda = yaml.safe_load((K8S / "components/autoscaling-keda/scaledobject.yaml").read_text())
    for trig in keda["spec"]["triggers"]:
        for m in promql_metrics(trig["metadata"]["query"]):
            uses.setdefault(m, set()).add("KEDA ScaledObject")
    return uses


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.fixture(scope="module")
def stack(smollm2_dir, tmp_path_factory):
    logs = tmp_path_factory.mktemp("logs")
    wport, gport = free_port(), free_port()
    procs = []
    try:
        wlog = open(logs / "worker.log", "w+")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "worker", "--model", str(smollm2_dir), "--port", str(wport),
             "--max-model-len", "1024", "--kv-cache-memory-gb", "0.1", "--served-model-name", "smol"],
            cwd=ROOT, stdout=wlog, stderr=subprocess.STDOUT, start_new_session=True))
        worker = f"http://127.0.0.1:{wport}"
        wait_healthy(worker, procs[0], 300, wlog)
        glog = open(logs / "gateway.log", "w+")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "gateway", "--workers", worker, "--port", str(gport)],
            cwd=ROOT, stdout=glog, stderr=subprocess.STDOUT, start_new_session=True))
        gateway = f"http://127.0.0.1:{gport}"
        wait_healthy(gateway, procs[1], 60, glog)
        yield worker, gateway
    finally:
        for p in reversed(procs):
            _stop(p)


def test_every_referenced_metric_is_exported(stack):
    worker, gateway = stack
    body = {"model": "smol", "prompt": "The capital of France is", "max_tokens": 6, "temperature": 0}
    r = httpx.post(gateway + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    chat = {"model": "smol", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 6,
            "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", gateway + "/v1/chat/completions", json=chat, timeout=120) as s:
        assert s.status_code == 200
        assert any(line.startswith("data: [DONE]") for line in s.iter_lines())
    time.sleep(0.5)   # let the gateway scrape the worker after the requests
    exposed = {}
    for url in (worker, gateway):
        m = httpx.get(url + "/metrics", timeout=10)
        assert m.status_code == 200
        exposed.update(exposed_names(m.text))
    uses = referenced_metrics()
    assert len(uses) >= 15
    missing = {name: sorted(where) for name, where in uses.items() if name not in exposed}
    assert not missing, "metrics used by the deployment but not exported:\n" + "\n".join(
        f"  {n}  (used by {', '.join(w)})" for n, w in sorted(missing.items()))
    # Histogram quantiles need real histograms; the autoscaler needs a gauge.
    for name in uses:
        if name.endswith("_bucket"):
            assert exposed[name] == "histogram", name
        if name.endswith("_total"):
            assert exposed[name] == "counter", name
    assert exposed["vllm:num_requests_waiting"] == "gauge"
