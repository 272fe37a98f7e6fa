"""vLLM with SwiftServe's plugin on a CUDA machine (the user's own, with ``vllm`` installed):
greedy parity with the reference engine with CUDA graphs on (no ``enforce_eager``), SwiftKV's
prefill skipping the later layers, the FP8 KV cache, and tensor parallelism over 2 GPUs.

Each test runs ``python -m swiftserve_vllm.probe`` in a subprocess, in the first Python that has
a CUDA build of vLLM: this one, or ``.venv-vllm`` (``make vllm-env VLLM_EXTRA=vllm TORCH_SPEC=torch``).
Skipped without CUDA, without such a Python, and (TP) with fewer than 2 GPUs."""

import json
import subprocess
import sys

import pytest
from gpu_support import ROOT, copy_tokenizer, needs_2_gpus, needs_cuda, prepared_smollm2, random_llama

pytestmark = [pytest.mark.gpu, needs_cuda]

PREFILL = 256
SHIPPED = ["SmolLM2-135M-Instruct-SwiftKV", "SmolLM2-135M-Instruct-SwiftKV-AcrossKV2"]
# TP=2 needs head counts that divide by 2 (SmolLM2's 9 / 3 do not): 8 query / 2 KV heads of 64.
TP_SHAPE = {"vocab_size": 49152, "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 4,
            "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64, "rms_norm_eps": 1e-5,
            "rope_theta": 100000.0, "max_position_embeddings": 2048, "tie_word_embeddings": True}


@pytest.fixture(scope="module")
def vllm_python() -> str:
    probe = "import torch, vllm; print(torch.cuda.is_available())"
    for py in (sys.executable, str(ROOT / ".venv-vllm" / "bin" / "python")):
        try:
            r = subprocess.run([py, "-c", probe], capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if r.returncode == 0 and r.stdout.strip().endswith("True"):
            return py
    pytest.skip("no Python with a CUDA build of vllm (this one, or .venv-vllm)")


def run_probe(py: str, models: list[str], tmp_path, *args: str) -> list[dict]:
    out = tmp_path / "probe.json"
    cmd = [py, "-m", "swiftserve_vllm.probe", "--compare", "--no-enforce-eager", "--prefill-len", str(PREFILL),
           "--out", str(out), *sum((["--model", m] for m in models), []), *args]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    return json.loads(out.read_text())


def test_plugin_greedy_parity_with_cuda_graphs(vllm_python, tmp_path):
    prepared_smollm2()
    for r in run_probe(vllm_python, SHIPPED, tmp_path):
        assert r["enforce_eager"] is False and r["swiftkv"] is True
        assert r["reference_parity"], (r["model"], r["tokens"], r["reference_tokens"])
        assert (r["tokens_head"], r["tokens_tail"]) == (PREFILL, 1)       # prefill tokens skip layers >= l


def test_fp8_kv_cache_with_cuda_graphs(vllm_python, tmp_path):
    prepared_smollm2()
    (auto,) = run_probe(vllm_python, SHIPPED[:1], tmp_path)
    (fp8,) = run_probe(vllm_python, SHIPPED[:1], tmp_path, "--kv-cache-dtype", "fp8_e4m3")
    assert fp8["kv_cache_dtype"] == "fp8_e4m3"
    assert fp8["kv_capacity_tokens"] > 1.8 * auto["kv_capacity_tokens"]     # 1 byte per element instead of 2
    assert (fp8["tokens_head"], fp8["tokens_tail"]) == (PREFILL, 1)


@needs_2_gpus
def test_tensor_parallel_2_matches_one_gpu(vllm_python, tmp_path):
    from modelkit.swiftkv import write_swiftkv_checkpoint

    base = random_llama(tmp_path / "tp-base", TP_SHAPE)
    copy_tokenizer(prepared_smollm2(), base)
    ckpt = write_swiftkv_checkpoint(base, tmp_path / "tp-swiftkv", 2, 1)
    (one,) = run_probe(vllm_python, [str(ckpt)], tmp_path)
    (two,) = run_probe(vllm_python, [str(ckpt)], tmp_path, "--tensor-parallel-size", "2")
    assert two["tensor_parallel_size"] == 2 and two["enforce_eager"] is False
    assert two["tokens"] == one["tokens"] and two["reference_parity"], (two["tokens"], two["reference_tokens"])
    assert (two["tokens_head"], two["tokens_tail"]) == (PREFILL, 1)
