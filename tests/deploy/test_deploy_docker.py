"""Dockerfile: hadolint-clean (with .hadolint.yaml), the three targets exist, run as a non-root
user with a HEALTHCHECK, their entry points parse with the real CLIs, every COPY source
exists and survives .dockerignore; the helper scripts the build uses work."""

import fnmatch
import http.server
import subprocess
import sys
import threading

import pytest
from deploy_support import ROOT, cli_argv, dockerfile_stages, effective, exec_form, image_args, parse_cli, run, tool

pytestmark = pytest.mark.e2e

TARGETS = {"gateway": "gateway", "cpu": "worker", "cuda": "worker"}


def test_hadolint():
    proc = run([tool("hadolint"), "--config", str(ROOT / ".hadolint.yaml"), str(ROOT / "Dockerfile")])
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("target", TARGETS)
def test_targets_run_as_non_root_with_healthcheck(target):
    stages = dockerfile_stages()
    user = effective(stages, target, "USER")
    assert user is not None and user.split(":")[0] not in ("root", "0")
    health = effective(stages, target, "HEALTHCHECK")
    assert health and "/health" in health
    entry, cmd = image_args(target)
    module, argv = cli_argv(entry, cmd)
    assert module == TARGETS[target]
    if module == "worker":
        ns = parse_cli(module, argv)
        assert ns.device == ("cuda" if target == "cuda" else "cpu")
        assert ns.host == "0.0.0.0" and ns.model == "default"


def _ignored(path: str, patterns: list[str]) -> bool:
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    return any(fnmatch.fnmatch(p, pat.rstrip("/")) for pat in patterns for p in prefixes)


def test_copy_sources_exist_and_are_not_dockerignored():
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    assert ".env" in patterns and ".git" in patterns and ".venv" in patterns
    sources = []
    for stage in dockerfile_stages().values():
        for instr, rest in stage:
            if instr == "COPY" and "--from=" not in rest:
                words = [w for w in (exec_form(rest) if rest.startswith("[") else rest.split())
                         if not w.startswith("--")]
                sources += words[:-1]
    assert sources
    for src in sources:
        assert (ROOT / src).exists(), f"COPY {src}: not in the build context"
        assert not _ignored(src, patterns), f"COPY {src}: excluded by .dockerignore"


def test_the_source_stage_copies_every_package_of_the_wheel():
    # pip installs /src with pyproject's packages.find: a package the stage does not copy is
    # silently left out of the image (swiftcommon was, and every server imports it)
    import tomllib

    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    wheel = {p.rstrip("*") for p in find["include"]}
    copied = {rest.split()[0] for instr, rest in dockerfile_stages()["source"]
              if instr == "COPY" and "--from=" not in rest}
    assert wheel - copied == set(), f"packages of the wheel the image leaves out: {sorted(wheel - copied)}"


@pytest.mark.parametrize("extra", ["k8s", "cpu", "gpu"])
def test_requirements_helper_expands_extras(extra):
    proc = run([sys.executable, "deploy/docker/pyproject_requirements.py", "pyproject.toml", extra])
    assert proc.returncode == 0, proc.stderr
    reqs = proc.stdout.split()
    assert any(r.startswith("fastapi") for r in reqs)
    assert any(r.startswith("kubernetes") for r in reqs) == (extra == "k8s")
    assert any(r.startswith("torch") for r in reqs) == (extra != "k8s")
    assert not any(r.startswith("swiftserve") for r in reqs)
    assert run([sys.executable, "deploy/docker/pyproject_requirements.py", "pyproject.toml", "nope"]).returncode == 2


def test_healthcheck_script():
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/ok" else 503)
            self.end_headers()

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    script = str(ROOT / "deploy/docker/healthcheck.py")
    try:
        assert run([sys.executable, script, base + "/ok"]).returncode == 0
        assert run([sys.executable, script, base + "/health"]).returncode == 1
    finally:
        server.shutdown()
    assert run([sys.executable, script, base + "/ok", "--timeout", "1"]).returncode == 1   # nothing listens now


@pytest.mark.model
def test_baked_model_resolves_from_the_image_cache(smollm2_dir, tmp_path):
    """The `models` stage: prepare_models.py copies the prepared model to /models/models and the
    image's SWIFTSERVE_CACHE=/models makes `--model default` find it without preparing anything."""
    cache = smollm2_dir.parent.parent
    dest = tmp_path / "models" / "models"
    proc = subprocess.run([sys.executable, "deploy/docker/prepare_models.py", "--dest", str(dest), "default"],
                          cwd=ROOT, capture_output=True, text=True, env={"SWIFTSERVE_CACHE": str(cache),
                                                                         "PATH": "/usr/bin:/bin"}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(dest / smollm2_dir.name)
    code = "from modelkit.models import resolve_model; print(resolve_model('default'))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={"SWIFTSERVE_CACHE": str(tmp_path / "models"), "PATH": "/usr/bin:/bin",
                              "HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(dest / smollm2_dir.name)
