"""Prometheus config and Grafana dashboards parse; the committed dashboard JSON is what
deploy/grafana/make_dashboard.py generates (both copies); every panel has a Prometheus query
on the provisioned datasource and the panels the issue asks for exist."""

import json
import subprocess
import sys

import yaml
from deploy_support import ROOT, promql_metrics
import pytest

pytestmark = pytest.mark.e2e

DASHBOARDS = sorted((ROOT / "deploy/grafana/dashboards").glob("*.json"))


def test_prometheus_config_parses():
    cfg = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    assert cfg["global"]["scrape_interval"]
    jobs = [j["job_name"] for j in cfg["scrape_configs"]]
    assert len(jobs) == len(set(jobs)) >= 2


def test_committed_dashboards_are_generated():
    proc = subprocess.run([sys.executable, "deploy/grafana/make_dashboard.py", "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_dashboards_are_well_formed():
    assert DASHBOARDS
    uid = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text())[
        "datasources"][0]["uid"]
    titles = []
    for path in DASHBOARDS:
        dash = json.loads(path.read_text())
        assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 36
        ids = [p["id"] for p in dash["panels"]]
        assert len(ids) == len(set(ids))
        for panel in dash["panels"]:
            titles.append(panel["title"].lower())
            assert panel["targets"], panel["title"]
            for t in panel["targets"]:
                assert t["datasource"] == {"type": "prometheus", "uid": uid}
                expr = t["expr"]
                assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}")
                assert promql_metrics(expr), expr
    text = " | ".join(titles)
    for wanted in ("time to first token", "time per output token", "throughput", "queue per worker",
                   "kv-cache occupancy", "kv bytes per token", "routing decisions", "errors",
                   "per model", "canary vs original: log-likelihood gap", "greedy agreement"):
        assert wanted in text, wanted


def test_promql_metric_extraction():
    expr = ('histogram_quantile(0.99, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket{job="w",'
            'status=~"[45].."}[1m]))) / on (instance) group_left swiftserve_worker_kv_bytes_per_token')
    assert promql_metrics(expr) == {"vllm:time_to_first_token_seconds_bucket", "swiftserve_worker_kv_bytes_per_token"}
