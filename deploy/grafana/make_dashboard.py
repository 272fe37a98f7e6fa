"""Writes the Grafana dashboard JSON (run after editing PANELS; commit the outputs).

    python deploy/grafana/make_dashboard.py            # write both copies
    python deploy/grafana/make_dashboard.py --check    # exit 1 if a committed copy is stale

Outputs (identical): deploy/grafana/dashboards/swiftserve.json (docker-compose's Grafana
provisioning) and k8s/components/monitoring/dashboards/swiftserve.json (a ConfigMap for
Grafana's dashboard sidecar in Kubernetes). The datasource uid is "prometheus" in both
(deploy/grafana/provisioning/datasources/prometheus.yml; kube-prometheus-stack's default).

Every metric used here is checked against a live worker and gateway by
tests/deploy/test_deploy_metrics.py.
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUTPUTS = [ROOT / "deploy" / "grafana" / "dashboards" / "swiftserve.json",
           ROOT / "k8s" / "components" / "monitoring" / "dashboards" / "swiftserve.json"]

Q = "histogram_quantile({q}, sum by (le) (rate({m}_bucket[1m])))"
QM = "histogram_quantile({q}, sum by (le, model) (rate({m}_bucket[1m])))"       # per model (variant)
MEAN = "sum by (model) (rate({m}_sum[5m])) / sum by (model) (rate({m}_count[5m]))"
G = "swiftserve_gateway_"
PANELS = [
    ("Time to first token (worker)", "s", [(Q.format(q=0.5, m="vllm:time_to_first_token_seconds"), "p50"),
                                           (Q.format(q=0.99, m="vllm:time_to_first_token_seconds"), "p99")]),
    ("Time to first token (gateway)", "s", [(Q.format(q=0.5, m="swiftserve_gateway_time_to_first_token_seconds"), "p50"),
                                            (Q.format(q=0.99, m="swiftserve_gateway_time_to_first_token_seconds"), "p99")]),
    ("Time per output token", "s", [(Q.format(q=0.5, m="vllm:request_time_per_output_token_seconds"), "p50"),
                                    (Q.format(q=0.99, m="vllm:request_time_per_output_token_seconds"), "p99")]),
    ("Time per output token (gateway)", "s", [(Q.format(q=0.5, m="swiftserve_gateway_time_per_output_token_seconds"), "p50"),
                                              (Q.format(q=0.99, m="swiftserve_gateway_time_per_output_token_seconds"), "p99")]),
    ("End-to-end latency", "s", [(Q.format(q=0.5, m="vllm:e2e_request_latency_seconds"), "p50"),
                                 (Q.format(q=0.99, m="vllm:e2e_request_latency_seconds"), "p99")]),
    ("Throughput (tokens/s)", "short", [("sum(rate(vllm:prompt_tokens_total[1m]))", "prompt"),
                                        ("sum(rate(vllm:generation_tokens_total[1m]))", "generated")]),
    ("Requests/s by status (gateway)", "reqps", [("sum by (status) (rate(swiftserve_gateway_requests_total[1m]))",
                                                  "{{status}}")]),
    ("Queue per worker", "short", [("vllm:num_requests_waiting", "waiting {{instance}}"),
                                   ("vllm:num_requests_running", "running {{instance}}"),
                                   ("swiftserve_gateway_queue_length", "gateway queue")]),
    ("KV-cache occupancy", "percentunit", [("vllm:kv_cache_usage_perc", "{{instance}}")]),
    ("KV bytes per token", "bytes", [("swiftserve_worker_kv_bytes_per_token", "{{instance}}"),
                                     ("swiftserve_worker_kv_bytes_per_token_baseline", "baseline {{instance}}")]),
    ("KV compression ratio", "short", [("swiftserve_worker_kv_compression_ratio", "{{instance}}")]),
    ("Routing decisions/s", "reqps", [("sum by (worker) (rate(swiftserve_gateway_routing_decisions_total[1m]))",
                                       "{{worker}}")]),
    ("Effective load per worker (gateway view)", "short", [("swiftserve_gateway_worker_effective_load", "{{worker}}"),
                                                           ("swiftserve_gateway_worker_in_flight", "in flight {{worker}}")]),
    ("Errors, rejections and retries", "reqps", [
        ("sum by (status) (rate(swiftserve_gateway_requests_total{status=~\"[45]..\"}[1m]))", "HTTP {{status}}"),
        ("sum by (reason) (rate(swiftserve_gateway_rejected_requests_total[1m]))", "rejected {{reason}}"),
        ("sum by (reason) (rate(swiftserve_gateway_retries_total[1m]))", "retry {{reason}}")]),
    ("Worker health (gateway view)", "short", [("swiftserve_gateway_worker_routable", "routable {{worker}}"),
                                               ("swiftserve_gateway_worker_circuit_open", "circuit open {{worker}}")]),
    ("Preemptions", "short", [("rate(swiftserve_worker_preemptions_total[1m])", "{{instance}}")]),
    # several models behind one gateway: per-variant latency next to the shadow comparison (docs/gateway.md)
    ("Requests/s per model and variant split", "reqps", [
        (f"sum by (model) (rate({G}requests_total[1m]))", "{{model}}"),
        (f"sum by (alias, model) (rate({G}split_requests_total[1m]))", "{{alias}} -> {{model}}")]),
    ("Time to first token per model (gateway)", "s", [
        (QM.format(q=0.5, m=G + "time_to_first_token_seconds"), "p50 {{model}}"),
        (QM.format(q=0.99, m=G + "time_to_first_token_seconds"), "p99 {{model}}")]),
    ("Time per output token per model (gateway)", "s", [
        (QM.format(q=0.5, m=G + "time_per_output_token_seconds"), "p50 {{model}}"),
        (QM.format(q=0.99, m=G + "time_per_output_token_seconds"), "p99 {{model}}")]),
    ("Canary vs original: log-likelihood gap (nats/token)", "short", [
        (MEAN.format(m=G + "shadow_logprob_gap_nats_per_token"), "gap {{model}}"),
        (MEAN.format(m=G + "shadow_nll_nats_per_token").replace("by (model)", "by (model, answer)"),
         "NLL {{model}} {{answer}}")]),
    ("Canary vs original: greedy agreement, invalid constrained outputs", "percentunit", [
        (MEAN.format(m=G + "shadow_greedy_agreement"), "agreement {{model}}"),
        (f"sum by (model) (rate({G}constrained_outputs_total{{valid=\"false\"}}[5m])) / "
         f"sum by (model) (rate({G}constrained_outputs_total[5m]))", "invalid {{model}}")]),
    ("Shadow comparisons/s by outcome", "reqps", [
        (f"sum by (model, outcome) (rate({G}shadow_requests_total[1m]))", "{{model}} {{outcome}}"),
        (f"{G}shadow_in_flight", "running")]),
]


def build() -> dict:
    panels = []
    for i, (title, unit, targets) in enumerate(PANELS):
        panels.append({
            "id": i + 1, "type": "timeseries", "title": title,
            "datasource": {"type": "prometheus", "uid": "prometheus"},
            "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
            "targets": [{"refId": chr(65 + j), "expr": e, "legendFormat": leg,
                         "datasource": {"type": "prometheus", "uid": "prometheus"}} for j, (e, leg) in enumerate(targets)],
        })
    return {"uid": "swiftserve", "title": "SwiftServe", "tags": ["swiftserve", "llm"], "timezone": "browser",
            "schemaVersion": 39, "version": 1, "refresh": "10s", "time": {"from": "now-30m", "to": "now"},
            "panels": panels, "templating": {"list": []}, "annotations": {"list": []}}


def render() -> str:
    return json.dumps(build(), indent=2) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        stale = [str(p) for p in OUTPUTS if not p.is_file() or p.read_text() != text]
        for p in stale:
            print(f"stale: {p} (run python deploy/grafana/make_dashboard.py)", file=sys.stderr)
        return 1 if stale else 0
    for out in OUTPUTS:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
