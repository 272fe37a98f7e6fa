"""k8s/: both overlays (and the optional components) render with ``kubectl kustomize`` and
every object validates, strictly, against the Kubernetes JSON schemas of the oldest and
newest version we support (``kubernetes-validate``, offline, bundled schemas). CRD objects
(ServiceMonitor, PodMonitor, ScaledObject) are not in those schemas: they are skipped by
kind there and checked structurally here. The wiring is checked too: container arguments
parse with the real worker/gateway CLIs, selectors match pod labels, probes hit /health."""

import json

import pytest
import yaml
from deploy_support import (
    CRD_KINDS,
    K8S,
    KUBERNETES_VERSIONS,
    ROOT,
    cli_argv,
    container,
    container_env,
    expand,
    find,
    image_args,
    kinds,
    module,
    mounted_configmaps,
    parse_cli,
    promql_metrics,
    remount,
    render,
    render_combo,
)

pytestmark = pytest.mark.e2e

OVERLAYS = ("cpu", "gpu")
WORKER_LABELS = {"app.kubernetes.io/name": "swiftserve", "app.kubernetes.io/component": "worker"}
POOLS = {"swiftserve-worker": ("original", "default"),     # Deployment: (pool label, --model)
         "swiftserve-worker-swiftkv": ("swiftkv", "/models/models/SmolLM2-135M-Instruct-SwiftKV-13pct")}
GATEWAY_LABELS = {"app.kubernetes.io/name": "swiftserve", "app.kubernetes.io/component": "gateway"}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kustomize")
    out = {name: render(K8S / "overlays" / name) for name in OVERLAYS}
    out["base"] = render(K8S / "base")
    out["gpu+monitoring"] = render_combo(tmp / "mon", ["overlays/gpu"], ["components/monitoring"])
    out["cpu+keda+pvc"] = render_combo(tmp / "keda", ["overlays/cpu"],
                                       ["components/autoscaling-keda", "components/model-pvc"])
    return out


def _subset(labels: dict, of: dict) -> bool:
    return all(of.get(k) == v for k, v in labels.items())


@pytest.mark.parametrize("name", ["base", *OVERLAYS, "gpu+monitoring", "cpu+keda+pvc"])
def test_objects_validate_against_kubernetes_schemas(rendered, name):
    kubernetes_validate = module("kubernetes_validate", "kubernetes-validate")
    checked = 0
    for obj in rendered[name]:
        if obj["kind"] in CRD_KINDS:
            continue        # CRDs: test_crd_objects
        for version in KUBERNETES_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{name}: {obj['kind']}/{obj['metadata']['name']} invalid for Kubernetes "
                            f"{version}: {exc.message} at {list(exc.path)}", pytrace=False)
        checked += 1
    assert checked >= 12


@pytest.mark.parametrize("name", ["base", *OVERLAYS])
def test_overlays_need_no_crds(rendered, name):
    # A cluster without the Prometheus operator or KEDA must be able to apply them.
    assert not kinds(rendered[name]) & CRD_KINDS


@pytest.mark.parametrize("name", ["base", *OVERLAYS, "gpu+monitoring", "cpu+keda+pvc"])
def test_everything_lands_in_one_namespace(rendered, name):
    for obj in rendered[name]:
        if obj["kind"] != "Namespace":
            assert obj["metadata"].get("namespace") == "swiftserve", f"{obj['kind']}/{obj['metadata']['name']}"


@pytest.mark.parametrize("name", OVERLAYS)
@pytest.mark.parametrize("pool", POOLS)
def test_worker_arguments_parse_with_the_worker_cli(rendered, name, pool):
    objs = rendered[name]
    deploy = find(objs, "Deployment", pool)
    c = container(deploy, "worker")
    target = "cuda" if c["image"].endswith("-cuda") else "cpu"
    assert target == {"cpu": "cpu", "gpu": "cuda"}[name]
    entry, _ = image_args(target)
    args = expand(c["args"], container_env(objs, deploy, "worker"))
    assert not any("$(" in a for a in args), args
    entry_module, argv = cli_argv(entry, args)
    assert entry_module == "worker"
    ns = parse_cli(entry_module, argv)
    assert ns.host == "0.0.0.0" and ns.port == 8000
    assert ns.device == ("cuda" if name == "gpu" else "cpu")
    assert ns.model == POOLS[pool][1]
    # The declared container port is the one the worker listens on.
    assert {"name": "http", "containerPort": ns.port, "protocol": "TCP"} in c["ports"]


@pytest.mark.parametrize("pool", POOLS)
def test_gpu_overlay_targets_h100_nodes(rendered, pool):
    objs = rendered["gpu"]
    deploy = find(objs, "Deployment", pool)
    spec = deploy["spec"]["template"]["spec"]
    c = container(deploy, "worker")
    assert c["image"].endswith(":0.1.0-cuda")
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert spec["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    shm = next(v for v in spec["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    env = container_env(objs, deploy, "worker")
    assert env["WORKER_DEVICE"] == "cuda" and env["WORKER_DTYPE"] == "bfloat16"
    # The CPU overlay asks for no GPU.
    cpu = container(find(rendered["cpu"], "Deployment", pool), "worker")
    assert "nvidia.com/gpu" not in cpu["resources"].get("limits", {})


def _gateway_config(objs, tmp):
    """The gateway container's arguments parsed by the real CLI, its mounted files in place."""
    deploy = find(objs, "Deployment", "swiftserve-gateway")
    c = container(deploy, "gateway")
    entry, _ = image_args("gateway")
    args = remount(expand(c["args"], container_env(objs, deploy, "gateway")),
                   mounted_configmaps(objs, deploy, "gateway", tmp))
    return deploy, c, parse_cli(*cli_argv(entry, args))


@pytest.mark.parametrize("name", OVERLAYS)
def test_gateway_discovers_workers_through_endpointslices(rendered, name, tmp_path):
    objs = rendered[name]
    deploy, c, cfg = _gateway_config(objs, tmp_path)
    assert cfg.k8s_namespace == "swiftserve"
    # The Service it watches is the workers' headless Service, with the named port.
    svc = find(objs, "Service", cfg.k8s_service)
    assert svc["spec"]["clusterIP"] == "None"
    assert _subset(svc["spec"]["selector"], WORKER_LABELS) and svc["spec"]["selector"] == WORKER_LABELS
    assert cfg.k8s_port_name in {p["name"] for p in svc["spec"]["ports"]}
    # RBAC: the gateway's ServiceAccount may list and watch EndpointSlices in its namespace.
    sa = deploy["spec"]["template"]["spec"]["serviceAccountName"]
    binding = find(objs, "RoleBinding")
    assert {"kind": "ServiceAccount", "name": sa, "namespace": "swiftserve"} in binding["subjects"]
    role = find(objs, "Role", binding["roleRef"]["name"])
    rule = next(r for r in role["rules"] if "endpointslices" in r["resources"])
    assert rule["apiGroups"] == ["discovery.k8s.io"] and {"list", "watch"} <= set(rule["verbs"])
    # API keys come from a Secret, in the variable swiftcommon/envs.py reads.
    keys = next(e for e in c["env"] if e["name"] == "SWIFTSERVE_API_KEYS")
    assert keys["valueFrom"]["secretKeyRef"]["name"] == "swiftserve-api-keys"
    # Workers never get an API token.
    worker = find(objs, "Deployment", "swiftserve-worker")["spec"]["template"]["spec"]
    assert worker["automountServiceAccountToken"] is False


@pytest.mark.parametrize("name", OVERLAYS)
def test_probes_follow_model_loading(rendered, name):
    worker = container(find(rendered[name], "Deployment", "swiftserve-worker"), "worker")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert worker[probe]["httpGet"] == {"path": "/health", "port": "http"}, probe
    # Loading may take minutes; the startup probe must allow it before liveness takes over.
    budget = worker["startupProbe"]["periodSeconds"] * worker["startupProbe"]["failureThreshold"]
    assert budget >= (1800 if name == "gpu" else 600)
    gateway = container(find(rendered[name], "Deployment", "swiftserve-gateway"), "gateway")
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/health"
    # The gateway's /health is 503 while no worker is routable: never a liveness check.
    assert "httpGet" not in gateway["livenessProbe"]
    for c in (worker, gateway):
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert set(c["resources"]) == {"requests", "limits"}


@pytest.mark.parametrize("name", OVERLAYS)
def test_disruption_budgets_and_network_policies_select_the_pods(rendered, name):
    objs = rendered[name]
    pods = {c: find(objs, "Deployment", f"swiftserve-{c}")["spec"]["template"]["metadata"]["labels"]
            for c in ("worker", "gateway")}
    for c in ("worker", "gateway"):
        pdb = find(objs, "PodDisruptionBudget", f"swiftserve-{c}")
        assert _subset(pdb["spec"]["selector"]["matchLabels"], pods[c])
    # Gateway high availability: two replicas, and a drain may never take both at once.
    replicas = find(objs, "Deployment", "swiftserve-gateway")["spec"]["replicas"]
    assert replicas >= 2 and 1 <= find(objs, "PodDisruptionBudget", "swiftserve-gateway")["spec"]["minAvailable"] < replicas
    pol = find(objs, "NetworkPolicy", "swiftserve-worker")
    assert _subset(pol["spec"]["podSelector"]["matchLabels"], pods["worker"])
    assert pol["spec"]["policyTypes"] == ["Ingress"]
    peers = [p for rule in pol["spec"]["ingress"] for p in rule["from"]]
    same_ns = [p for p in peers if "namespaceSelector" not in p]
    # Only the gateway (same namespace) and Prometheus (namespace + pod selector) get in.
    assert len(same_ns) == 1 and _subset(same_ns[0]["podSelector"]["matchLabels"], pods["gateway"])
    assert not _subset(same_ns[0]["podSelector"]["matchLabels"], pods["worker"])
    assert all("podSelector" in p for p in peers)


def _adapter_rules() -> list[dict]:
    return yaml.safe_load((K8S / "prometheus-adapter" / "values.yaml").read_text())["rules"]["custom"]


def adapter_metrics() -> dict[str, set[str]]:
    """{custom-metrics API name: Prometheus metric names it is computed from}."""
    out = {}
    for rule in _adapter_rules():
        series = promql_metrics(rule["seriesQuery"])
        pattern = rule["name"]["matches"].strip("^$")
        assert series == {pattern}, rule
        out[rule["name"]["as"]] = series
    return out


def test_hpa_scales_workers_on_the_queue_metric(rendered):
    objs = rendered["gpu"]
    hpa = find(objs, "HorizontalPodAutoscaler", "swiftserve-worker")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": "swiftserve-worker"}
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    # The adapter rule produces exactly the metric the HPA asks for, from the worker gauge.
    assert adapter_metrics()[metric["pods"]["metric"]["name"]] == {"vllm:num_requests_waiting"}
    assert hpa["spec"]["minReplicas"] >= 2
    # The HPA owns the replica count; the CPU overlay keeps a fixed one.
    assert "replicas" not in find(objs, "Deployment", "swiftserve-worker")["spec"]
    assert find(rendered["cpu"], "Deployment", "swiftserve-worker")["spec"]["replicas"] == 2


def test_crd_objects(rendered):
    objs = rendered["gpu+monitoring"]
    pod_labels = find(objs, "Deployment", "swiftserve-worker")["spec"]["template"]["metadata"]["labels"]
    pm = find(objs, "PodMonitor", "swiftserve-worker")
    assert pm["apiVersion"] == "monitoring.coreos.com/v1"
    assert _subset(pm["spec"]["selector"]["matchLabels"], pod_labels)
    worker_ports = {p["name"] for p in container(find(objs, "Deployment", "swiftserve-worker"), "worker")["ports"]}
    assert {e["port"] for e in pm["spec"]["podMetricsEndpoints"]} <= worker_ports
    assert all(e["path"] == "/metrics" for e in pm["spec"]["podMetricsEndpoints"])
    sm = find(objs, "ServiceMonitor", "swiftserve-gateway")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    svc = find(objs, "Service", "swiftserve-gateway")
    assert _subset(sm["spec"]["selector"]["matchLabels"], svc["metadata"]["labels"])
    assert {e["port"] for e in sm["spec"]["endpoints"]} <= {p["name"] for p in svc["spec"]["ports"]}
    # The dashboard ConfigMap carries the same JSON as docker-compose's Grafana.
    cm = find(objs, "ConfigMap", "swiftserve-grafana-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    committed = json.loads((ROOT / "deploy/grafana/dashboards/swiftserve.json").read_text())
    assert json.loads(cm["data"]["swiftserve.json"]) == committed

    objs = rendered["cpu+keda+pvc"]
    so = find(objs, "ScaledObject", "swiftserve-worker")
    assert so["apiVersion"] == "keda.sh/v1alpha1"
    assert so["spec"]["scaleTargetRef"]["name"] == "swiftserve-worker"
    (trigger,) = so["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    assert promql_metrics(trigger["metadata"]["query"]) == {"vllm:num_requests_waiting"}
    assert "replicas" not in find(objs, "Deployment", "swiftserve-worker")["spec"]
    assert "HorizontalPodAutoscaler" not in kinds(objs)


def test_model_pvc_component_mounts_the_model(rendered):
    objs = rendered["cpu+keda+pvc"]
    deploy = find(objs, "Deployment", "swiftserve-worker")
    c = container(deploy, "worker")
    mount = next(m for m in c["volumeMounts"] if m["name"] == "models")
    assert mount["readOnly"] is True
    vol = next(v for v in deploy["spec"]["template"]["spec"]["volumes"] if v["name"] == "models")
    claim = find(objs, "PersistentVolumeClaim", vol["persistentVolumeClaim"]["claimName"])
    assert claim["metadata"]["namespace"] == "swiftserve"
    env = container_env(objs, deploy, "worker")
    assert env["WORKER_MODEL"].startswith(mount["mountPath"] + "/")
    ns = parse_cli(*cli_argv(image_args("cpu")[0], expand(c["args"], env)))
    assert ns.model == env["WORKER_MODEL"]


@pytest.mark.parametrize("name", OVERLAYS)
def test_two_model_pools_behind_one_gateway(rendered, name, tmp_path):
    """One Deployment per model, with disjoint selectors; the workers' one headless Service
    selects both (the gateway learns each pod's model from its /v1/models); the gateway's
    mounted models table splits the original's name over both pools' models and parses with
    the gateway's own reader; disruption budget, network policy and PodMonitor cover both."""
    from gateway.aliases import read_aliases

    objs = rendered[name]
    deploys = {p: find(objs, "Deployment", p) for p in POOLS}
    selectors = [d["spec"]["selector"]["matchLabels"] for d in deploys.values()]
    for pool, d in deploys.items():
        labels = d["spec"]["template"]["metadata"]["labels"]
        assert labels["swiftserve.io/pool"] == POOLS[pool][0] and _subset(WORKER_LABELS, labels)
        assert _subset(d["spec"]["selector"]["matchLabels"], labels)
    assert selectors[0]["swiftserve.io/pool"] != selectors[1]["swiftserve.io/pool"]
    svc = find(objs, "Service", "swiftserve-worker")
    assert all(_subset(svc["spec"]["selector"], d["spec"]["template"]["metadata"]["labels"]) for d in deploys.values())
    for kind in ("PodDisruptionBudget", "NetworkPolicy"):
        obj = find(objs, kind, "swiftserve-worker")
        sel = obj["spec"]["selector"]["matchLabels"] if kind == "PodDisruptionBudget" else \
            obj["spec"]["podSelector"]["matchLabels"]
        assert all(_subset(sel, d["spec"]["template"]["metadata"]["labels"]) for d in deploys.values())
    _, _, cfg = _gateway_config(objs, tmp_path)
    (alias,) = read_aliases(cfg.models_config).values()
    served = {"SmolLM2-135M-Instruct", POOLS["swiftserve-worker-swiftkv"][1].rsplit("/", 1)[1]}
    assert {m for m, _ in alias.targets} == served and alias.shadow.reference == "SmolLM2-135M-Instruct"
    # The models table is mounted from a ConfigMap without a name hash, so edits reach the running gateway.
    cm = find(objs, "ConfigMap", "swiftserve-gateway-models")
    assert "models.yaml" in cm["data"]
