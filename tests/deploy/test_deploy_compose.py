"""docker-compose.yml (and the GPU override): valid for docker-compose v1 (`config`, no
engine needed) and for the compose-spec JSON schema (check-jsonschema's vendored copy);
the commands parse with the real CLIs on top of the image entry points; Prometheus and
Grafana are wired to the services and files that exist."""

import pytest
import yaml
from deploy_support import ROOT, cli_argv, image_args, parse_cli, remount, run, tool

pytestmark = pytest.mark.e2e

COMPOSE = ROOT / "docker-compose.yml"
GPU = ROOT / "deploy" / "compose" / "docker-compose.gpu.yml"
FILE_SETS = {"cpu": [COMPOSE], "gpu": [COMPOSE, GPU]}


@pytest.mark.parametrize("files", FILE_SETS.values(), ids=FILE_SETS.keys())
def test_docker_compose_v1_config(files):
    cmd = [tool("docker-compose")]
    for f in files:
        cmd += ["-f", str(f)]
    proc = run(cmd + ["config", "--quiet"])
    assert proc.returncode == 0, proc.stderr


def test_compose_spec_schema():
    proc = run([tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(COMPOSE), str(GPU)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _merged(files) -> dict:
    """The services after applying override files (the keys we use are replaced whole)."""
    services: dict = {}
    for f in files:
        for name, svc in yaml.safe_load(f.read_text())["services"].items():
            services.setdefault(name, {}).update(svc)
    return services


@pytest.mark.parametrize("variant", FILE_SETS)
def test_commands_parse_with_the_real_clis(variant):
    services = _merged(FILE_SETS[variant])
    workers = [n for n in services if n.startswith("worker-")]
    assert len(workers) == 2
    models = set()
    for name in workers:
        svc = services[name]
        target = svc["build"]["target"]
        assert target == ("cuda" if variant == "gpu" else "cpu")
        ns = parse_cli(*cli_argv(image_args(target)[0], svc["command"]))
        assert ns.device == ("cuda" if variant == "gpu" else "cpu")
        assert ns.host == "0.0.0.0" and ns.port == 8000
        models.add(ns.model)
        # the image bakes the model a path names (shipped variants come in through EXTRA_MODELS)
        if ns.model.startswith("/models/models/"):
            assert ns.model.rsplit("/", 1)[1] in svc["build"]["args"]["EXTRA_MODELS"].split()
    assert models == {"default", "/models/models/SmolLM2-135M-Instruct-SwiftKV-13pct"}     # two model pools
    gw = services["gateway"]
    cfg = parse_cli(*cli_argv(image_args(gw["build"]["target"])[0], remount(gw["command"], _mounts(gw))))
    assert sorted(cfg.workers) == sorted(f"http://{w}:8000" for w in workers)
    assert set(gw["depends_on"]) == set(workers)
    assert all(d["condition"] == "service_healthy" for d in gw["depends_on"].values())
    assert "SWIFTSERVE_API_KEYS" in gw["environment"]
    # The mounted models table splits the original's name over both pools' models.
    from gateway.aliases import read_aliases

    (alias,) = read_aliases(cfg.models_config).values()
    assert {m for m, _ in alias.targets} == {"SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct-SwiftKV-13pct"}


def _mounts(svc: dict) -> dict:
    """{container path: host path} of a service's bind mounts of repository directories."""
    out = {}
    for v in svc.get("volumes", []):
        src, dst = v.split(":")[:2]
        if src.startswith("./"):
            out[dst] = ROOT / src
    return out


def test_prometheus_and_grafana_are_wired():
    services = _merged([COMPOSE])
    prom = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    targets = {t for job in prom["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    assert targets == {"gateway:8000", "worker-1:8000", "worker-2:8000"}
    assert all(job.get("metrics_path", "/metrics") == "/metrics" for job in prom["scrape_configs"])
    ds = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text())
    (source,) = ds["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    assert "prometheus" in services
    provider = yaml.safe_load((ROOT / "deploy/grafana/provisioning/dashboards/swiftserve.yml").read_text())
    dash_dir = provider["providers"][0]["options"]["path"]
    mounts = {}
    for name in ("prometheus", "grafana"):
        for v in services[name]["volumes"]:
            src, dst = v.split(":")[:2]
            if src.startswith("./"):
                assert (ROOT / src).exists(), src
                mounts[dst] = src
    assert mounts[dash_dir] == "./deploy/grafana/dashboards"
    assert "./deploy/prometheus/prometheus.yml" in mounts.values()
