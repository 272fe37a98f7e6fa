"""Check the plugin against one installed vLLM release and record what was checked.

    python -m swiftserve_vllm.release_check --python .venv-vllm-0.31.0/bin/python --mode tests
    python -m swiftserve_vllm.release_check --python .venv-vllm-gpu-0.33.0/bin/python --mode construct

``--python``: an environment with that vLLM and this project (``make vllm-release-check`` /
``make vllm-wheel-check`` build them).
- ``tests``: the whole vLLM test suite (``tests/swiftserve_vllm``: compiled greedy parity with the
  reference engine, TP=2, PP=2, FP8 KV through the worker, the served stack, meta-device
  construction) run from this environment against that vLLM (``SWIFTSERVE_TEST_VLLM_PY``);
- ``construct``: for a CUDA wheel on a machine without a GPU: the plugin imports and registers,
  and every model class builds on the meta device (vLLM's CPU platform forced), via
  ``swiftserve_vllm.devcheck``; nothing runs a forward pass.
Writes ``<out>/<distribution>-<version>.json``: what was checked, pass/fail, counts, the command.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CONSTRUCT_MODELS = ("SmolLM2-135M-Instruct-SwiftKV", "SmolLM2-135M-Instruct-SwiftKV-AcrossKV2")


def installed(python: str) -> tuple[str, str, str]:
    """(vLLM distribution, its version, torch's version) in that environment."""
    code = "import torch; from swiftserve_vllm.version import installed; print(*installed(), torch.__version__)"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    return out[0], out[1], out[2]


def run_tests(python: str, extra: list[str]) -> dict:
    env = {**os.environ, "SWIFTSERVE_TEST_VLLM_PY": python}
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", "tests/swiftserve_vllm",
                        *extra], cwd=ROOT, env=env, capture_output=True, text=True)
    lines = p.stdout.strip().splitlines()
    tail = lines[-1] if lines else p.stderr[-500:]
    failures = [x for x in lines if x.startswith(("FAILED ", "ERROR "))]
    counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|skipped|error)", tail)}
    return {"passed": p.returncode == 0 and counts.get("passed", 0) > 0 and not counts.get("skipped"),
            "counts": counts, "pytest_summary": tail, "failures": failures,
            "checked": "tests/swiftserve_vllm on CPU: compiled greedy parity of SwiftKV g=1/g=2 and ZACK with the "
                       "reference engine, TP=2, PP=2, devcheck, the served worker stack with FP8 KV"}


def run_construct(python: str) -> dict:
    from swiftserve_vllm.testmodels import make_test_models

    with tempfile.TemporaryDirectory() as t:
        made = make_test_models(Path(t) / "models")
        out = Path(t) / "devcheck.json"
        cmd = [python, "-m", "swiftserve_vllm.devcheck", "--platform", "cpu", "--out", str(out)]
        models = (*CONSTRUCT_MODELS, made["zack-r32"], made["tp-zack"], made["tp-zack-lw"])
        for m in models:
            cmd += ["--model", str(m)]
        p = subprocess.run(cmd, env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"}, capture_output=True, text=True)
        res = json.loads(out.read_text()) if out.is_file() else []
    runner = all(r.get("v1_runner_for_plugin") in (True, None) for r in res)
    return {"passed": p.returncode == 0 and len(res) == len(models) and runner, "devcheck": res,
            "stderr_tail": p.stderr[-1500:],
            "checked": "import of every vLLM symbol the plugin uses (swiftserve_vllm.compat), plugin registration, "
                       "construction of the model class for SwiftKV g=1/g=2, ZACK r32 (uniform and layer-wise) and the "
                       "TP test cut on the meta device with no stray tensor, vLLM steered to its V1 runner for the "
                       "plugin's classes (compat.prefer_v1_model_runner); no forward pass (no GPU here)"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--python", required=True, help="python of the environment with the vLLM release")
    p.add_argument("--mode", choices=("tests", "construct"), required=True)
    p.add_argument("--out", default="results/vllm/versions")
    p.add_argument("pytest_args", nargs="*", help="extra pytest arguments (tests mode)")
    args = p.parse_args(argv)
    dist, version, torch_version = installed(args.python)
    res = run_tests(args.python, args.pytest_args) if args.mode == "tests" else run_construct(args.python)
    doc = {"distribution": dist, "version": version, "torch": torch_version, "mode": args.mode,
           "command": "python -m swiftserve_vllm.release_check " + shlex.join(sys.argv[1:] if argv is None else argv), **res}
    _write_json(Path(args.out) / f"{dist}-{version}.json", doc)
    print(json.dumps({k: doc[k] for k in ("distribution", "version", "mode", "passed")}))
    return 0 if res["passed"] else 1


def _write_json(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
