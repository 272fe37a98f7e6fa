"""Security properties of the deployment artifacts: workers are reachable only through the
gateway (compose: no published port, an internal network; Kubernetes: a headless Service, a
NetworkPolicy admitting only the gateway and Prometheus, only the gateway exposed), and every
artifact leaves a worker and a gateway time to drain on SIGTERM (worker.shutdown,
gateway.shutdown) before it is killed; rolling updates replace one pod at a time, surging first."""

import pytest
import yaml
from deploy_support import K8S, ROOT, container, find, render

from gateway.config import GatewayConfig
from gateway.shutdown import ABORT_GRACE
from worker.args import build_parser

pytestmark = pytest.mark.e2e

DRAIN = build_parser().parse_args([]).drain_timeout
GATEWAY_DRAIN = GatewayConfig().drain_timeout


def test_compose_workers_only_behind_the_gateway():
    doc = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services, networks = doc["services"], doc["networks"]
    workers = {n: s for n, s in services.items() if n.startswith("worker-")}
    assert len(workers) == 2
    for name, svc in workers.items():
        assert "ports" not in svc, f"{name} publishes a port"
        assert svc["networks"] and all(networks[n].get("internal") is True for n in svc["networks"]), name
        grace = int(str(svc["stop_grace_period"]).rstrip("s"))
        assert grace >= DRAIN + 10, f"{name}: stop_grace_period {grace}s < drain {DRAIN}s + margin"
    gw = services["gateway"]
    assert int(str(gw["stop_grace_period"]).rstrip("s")) >= GATEWAY_DRAIN + ABORT_GRACE
    assert gw["ports"] == ["8000:8000"]
    backend = set(next(iter(workers.values()))["networks"])
    assert backend & set(gw["networks"]) and backend & set(services["prometheus"]["networks"])
    published = [n for n, s in services.items() if s.get("ports")]
    assert not any(n.startswith("worker-") for n in published)
    assert not backend & set(services["grafana"].get("networks", ["default"]))


@pytest.fixture(scope="module")
def base():
    return render(K8S / "base")


def test_kubernetes_exposes_only_the_gateway(base):
    services = {o["metadata"]["name"]: o for o in base if o["kind"] == "Service"}
    worker_svc = services["swiftserve-worker"]
    assert worker_svc["spec"].get("clusterIP") == "None" and worker_svc["spec"].get("type", "ClusterIP") == "ClusterIP"
    exposed = [n for n, s in services.items() if s["spec"].get("type") in ("NodePort", "LoadBalancer")]
    assert all("worker" not in n for n in exposed)
    assert not [o for o in base if o["kind"] == "Ingress" and "worker" in yaml.safe_dump(o)]
    pol = find(base, "NetworkPolicy", "swiftserve-worker")
    assert all(rule.get("from") for rule in pol["spec"]["ingress"])          # no rule open to everyone


def test_kubernetes_termination_grace_covers_the_drain(base):
    deploy = find(base, "Deployment", "swiftserve-worker")
    spec = deploy["spec"]["template"]["spec"]
    c = container(deploy, "worker")
    pre_stop = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
    drain = next((float(a.split("=", 1)[1]) for a in c.get("args", []) if a.startswith("--drain-timeout=")), DRAIN)
    assert spec["terminationGracePeriodSeconds"] >= pre_stop + drain + 10


def test_kubernetes_gateway_grace_and_rolling_updates(base):
    gw = find(base, "Deployment", "swiftserve-gateway")
    c = container(gw, "gateway")
    drain = next((float(a.split("=", 1)[1]) for a in c.get("args", []) if a.startswith("--drain-timeout=")),
                 GATEWAY_DRAIN)
    assert gw["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= drain + ABORT_GRACE
    # One pod at a time, the new one ready before an old one drains: a drain's aborted streams
    # always have another worker to migrate to (gateway.failover).
    for name in ("swiftserve-gateway", "swiftserve-worker"):
        ru = find(base, "Deployment", name)["spec"]["strategy"]["rollingUpdate"]
        assert ru["maxUnavailable"] == 0 and ru["maxSurge"] == 1, name
