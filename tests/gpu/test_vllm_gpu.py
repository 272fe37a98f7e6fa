"""vLLM with SwiftServe's plugin on CUDA, compiled with CUDA graphs as vLLM runs by default,
against the same model eager and against the reference engine (greedy parity).

Each module fixture runs ``python -m swiftserve_vllm.probe`` once, in a subprocess of the first
Python that has a CUDA build of vLLM (this one, e.g. with the GPU session's vLLM on PYTHONPATH, or
``.venv-vllm``), on one model (or two) with a fixed KV budget, compiled and (``--also-eager``) eager:
- ``g1`` / ``g2``: the shipped SmolLM2 SwiftKV checkpoints g=1 and g=2 (AcrossKV);
- ``fp8``: g=1 with vLLM's FP8 KV cache;
- ``fp8-weights``: g=1 with its linear weights quantized to FP8 by vLLM at load (``--quantization fp8``,
  what Snowflake's FP8 SwiftKV checkpoints carry), every FP8 layer checked against the checkpoint;
- ``zack``: ZACK at uniform rank 32 over a 6-query / 2-KV-head cut of SwiftKV g=2;
- ``zack-lw``: layer-wise ranks 64/32 over that cut: caches of two head sizes, which vLLM puts
  in separate KV-cache groups and the plugin's KV-sharing fix serves;
- ``heads``: ZACK without SwiftKV at uniform ranks 32 and 40 (head sizes FA3 runs in its 64-wide
  kernel), compiled only, against the torch reference of ZACK's semantics.
The groups are independent (``xdist_group``): the GPU session runs them at once on one GPU
(``pytest -n 7 --dist loadgroup``; each engine takes a small share of the memory).
Rules (``gpubundle.vllm_results``): the compiled run captured CUDA graphs, on vLLM's
V1 runner; its tokens equal the reference engine's (or ZACK's torch reference) and the eager
run's until they part, if ever, at a near-tie of its own; prompt tokens never reach SwiftKV's
later layers; the KV capacity is what the
budget buys at the layout's bytes per token. With ``SWIFTSERVE_GPU_VLLM_RESULTS`` set each probe
run is recorded there for the session's summary. Skipped without CUDA or such a Python, and
(TP) with fewer than 2 GPUs."""

import json
import subprocess
import sys
import time

import pytest
from gpu_support import ROOT, needs_2_gpus, needs_cuda, prepared_smollm2

from gpubundle import vllm_results as R

pytestmark = [pytest.mark.e2e, pytest.mark.gpu, pytest.mark.vllm, needs_cuda]

PREFILL = 256
MAX_TOKENS = 12
KV_GB = 0.5
GPU_SHARE = "0.12"           # gpu_memory_utilization per engine: seven at once fit one GPU
G1, G2 = "SmolLM2-135M-Instruct-SwiftKV", "SmolLM2-135M-Instruct-SwiftKV-AcrossKV2"


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


def run_probe(py: str, models: list[str], tmp_path, *args: str, group: str | None = None) -> list[dict]:
    # bfloat16 on both sides (vLLM on the GPU, the reference engine on the CPU): the dtype users serve
    tmp_path.mkdir(parents=True, exist_ok=True)
    live = R.probe_dir() if group else None       # the GPU session's: collected even after a time-out
    out = (live or tmp_path) / f"{group or 'probe'}.json"
    log = (live or tmp_path) / f"{group or 'probe'}.log"
    cmd = [py, "-m", "swiftserve_vllm.probe", "--compare", "--no-enforce-eager", "--prefill-len", str(PREFILL),
           "--max-tokens", str(MAX_TOKENS), "--dtype", "bfloat16", "--kv-gb", str(KV_GB),
           "--gpu-memory-utilization", GPU_SHARE, "--ref-kernels", "torch", "--out", str(out),
           *sum((["--model", m] for m in models), []), *args]
    t0 = time.monotonic()
    with open(log, "w") as f:                     # streamed, not captured: a killed run leaves its log
        f.write(" ".join(cmd) + "\n")
        f.flush()
        r = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, text=True, timeout=1800)
    results = json.loads(out.read_text()) if out.is_file() else []
    for rec in results:
        rec["probe_seconds"] = round(time.monotonic() - t0, 1)
    if group:
        R.record(group, results)
    assert r.returncode == 0, log.read_text(errors="replace")[-6000:]
    return results


def expected_capacity(model_dir: str, dtype_bytes: int) -> float:
    """Tokens the KV budget holds at the layout's bytes per token (vLLM rounds down to whole blocks)."""
    from swiftserve_vllm.layout import load_layout

    return KV_GB * 2 ** 30 / load_layout(model_dir).kv_bytes_per_token(dtype_bytes)


def _models(tmp_path_factory, *names: str) -> list[str]:
    from swiftserve_vllm.reference import make_random_zack
    from swiftserve_vllm.testmodels import make_test_models

    base = prepared_smollm2()
    made = make_test_models(tmp_path_factory.mktemp("models"), [n for n in names if n != "zack-r40"])
    if "zack-r40" in names:
        made["zack-r40"] = make_random_zack(base, tmp_path_factory.mktemp("zack-r40") / "m", 40, kind="weights")
    return [str(made[n]) for n in names]


def _probe(vllm_python, tmp_path_factory, group: str, models: list[str], *args: str) -> list[dict]:
    prepared_smollm2()
    return run_probe(vllm_python, models, tmp_path_factory.mktemp(group), *args, group=group)


@pytest.fixture(scope="module")
def g1(vllm_python, tmp_path_factory):
    return _probe(vllm_python, tmp_path_factory, "g1", [G1], "--also-eager")[0]


@pytest.fixture(scope="module")
def g2(vllm_python, tmp_path_factory):
    return _probe(vllm_python, tmp_path_factory, "g2", [G2], "--also-eager")[0]


def _graphed_and_on_v1(r: dict) -> None:
    assert R.on_cuda_with_graphs(r), (r["model"], r["enforce_eager"], r["cudagraph_mode"], r["graphs"])
    assert r["model_runner"] == "v1" and "NONE" not in r["cudagraph_mode"], (r["model_runner"], r["cudagraph_mode"])
    assert r["dtype"] == "bfloat16"


def _swiftkv(r: dict) -> None:
    _graphed_and_on_v1(r)
    assert r["swiftkv"] is True
    assert R.parity(r, r["reference_tokens"], R.REFERENCE_TOKENS), (r["tokens"], r["reference_tokens"], r["top2"])
    assert R.parity(r, r["eager_tokens"], R.EAGER_TOKENS), (r["tokens"], r["eager_tokens"], r["top2"])
    # prompt tokens skip layers >= l, compiled (piecewise graphs around the eager row selection) and eager
    assert (r["tokens_head"], r["tokens_tail"]) == (PREFILL, 1)
    assert (r["eager_tokens_head"], r["eager_tokens_tail"]) == (PREFILL, 1)


@pytest.mark.xdist_group("g1")
def test_swiftkv_g1_with_cuda_graphs_matches_eager_and_the_reference_engine(g1):
    _swiftkv(g1)
    assert 0.9 < g1["kv_capacity_tokens"] / expected_capacity(g1["model"], 2) <= 1.01


@pytest.mark.xdist_group("g2")
def test_acrosskv_g2_with_cuda_graphs_matches_eager_and_holds_fewer_caches(g2):
    _swiftkv(g2)
    assert g2["kv_cache_layers"] == 23                          # 15 own + 15 later layers in groups of 2
    assert 0.9 < g2["kv_capacity_tokens"] / expected_capacity(g2["model"], 2) <= 1.01


@pytest.mark.xdist_group("fp8")
def test_fp8_kv_cache_with_cuda_graphs_matches_eager(vllm_python, tmp_path_factory):
    (fp8,) = _probe(vllm_python, tmp_path_factory, "fp8", [G1], "--kv-cache-dtype", "fp8_e4m3", "--also-eager")
    _graphed_and_on_v1(fp8)
    assert fp8["kv_cache_dtype"] == "fp8_e4m3" and all(len(t) == MAX_TOKENS for t in fp8["tokens"])
    # the same FP8 cache both ways
    assert R.parity(fp8, fp8["eager_tokens"], R.EAGER_TOKENS), (fp8["tokens"], fp8["eager_tokens"], fp8["top2"])
    # against the 16-bit reference only the first token (the prefill, before FP8 values are read) is asked for
    assert R.agree(fp8["tokens"], fp8["reference_tokens"], 1, fp8["top2"]), (fp8["tokens"], fp8["reference_tokens"])
    assert 0.9 < fp8["kv_capacity_tokens"] / expected_capacity(fp8["model"], 1) <= 1.01   # 1 byte per element
    assert (fp8["tokens_head"], fp8["tokens_tail"]) == (PREFILL, 1)


@pytest.mark.xdist_group("fp8-weights")
def test_fp8_weights_on_the_swiftkv_model_with_cuda_graphs(vllm_python, tmp_path_factory):
    (r,) = _probe(vllm_python, tmp_path_factory, "fp8-weights", [G1], "--quantization", "fp8")
    _graphed_and_on_v1(r)
    assert r["quantization"] == "fp8" and r["swiftkv"] is True
    # 15 layers < l x (qkv, o, gate_up, down) + 15 later x (q, o, gate_up, down) + the fused SwiftKV K/V,
    # each within FP8's rounding of the checkpoint's bf16 layer (a shard or scale in the wrong rows: tens of %)
    q = r["quantized"]
    assert q["quantized_layers"] == 121 and q["quantized_max_rel_error"] < 0.1, q
    assert (r["tokens_head"], r["tokens_tail"]) == (PREFILL, 1)
    # against the bf16 reference engine: the first token (the prefill), and vLLM's tokens likely to it
    assert R.agree(r["tokens"], r["reference_tokens"], 1, r["top2"]), (r["tokens"], r["reference_tokens"])
    assert r["reference_logprob_gap"] < 1.0, (r["tokens"], r["reference_logprobs"], r["top2"])


@pytest.mark.xdist_group("zack")
def test_zack_uniform_over_swiftkv_with_cuda_graphs_matches_eager_and_the_reference_engine(vllm_python,
                                                                                           tmp_path_factory):
    (r,) = _probe(vllm_python, tmp_path_factory, "zack", _models(tmp_path_factory, "tp-zack"), "--also-eager")
    _graphed_and_on_v1(r)
    assert r["zack_rank"] == 32 and r["swiftkv"] is True
    assert R.compiled_parity(r), (r["tokens"], R.reference_of(r), r["eager_tokens"])
    assert (r["tokens_head"], r["tokens_tail"]) == (PREFILL, 1)


@pytest.mark.xdist_group("zack-lw")
def test_layerwise_zack_kv_cache_groups_of_two_head_sizes_with_cuda_graphs(vllm_python, tmp_path_factory):
    from swiftserve_vllm.testmodels import LAYERWISE

    (r,) = _probe(vllm_python, tmp_path_factory, "zack-lw", _models(tmp_path_factory, "tp-zack-lw"), "--also-eager")
    _graphed_and_on_v1(r)
    assert r["zack_ranks"] == LAYERWISE and set(LAYERWISE) == {64, 32}
    assert R.compiled_parity(r), (r["tokens"], r["reference_tokens"], r["eager_tokens"])
    assert (r["tokens_head"], r["tokens_tail"]) == (PREFILL, 1)


@pytest.mark.xdist_group("heads")
def test_flash_attention_runs_zacks_head_sizes(vllm_python, tmp_path_factory):
    names = ("zack-r32", "zack-r40")
    res = _probe(vllm_python, tmp_path_factory, "heads", _models(tmp_path_factory, *names))
    for name, r in zip(names, res):
        _graphed_and_on_v1(r)
        assert r["zack_rank"] == int(name[-2:])
        assert R.parity(r, r["torch_reference_tokens"], R.REFERENCE_TOKENS), (name, r["tokens"],
                                                                               r["torch_reference_tokens"], r["top2"])


@needs_2_gpus
@pytest.mark.xdist_group("tp")
def test_tensor_parallel_2_matches_one_gpu(vllm_python, tmp_path_factory):
    models = _models(tmp_path_factory, "tp-g1", "tp-g2", "tp-zack")
    one = run_probe(vllm_python, models, tmp_path_factory.mktemp("tp1"))
    two = run_probe(vllm_python, models, tmp_path_factory.mktemp("tp2"), "--tensor-parallel-size", "2")
    for a, b in zip(one, two):
        assert b["tensor_parallel_size"] == 2 and b["enforce_eager"] is False
        assert R.parity(a, b["tokens"], R.REFERENCE_TOKENS), (b["model"], a["tokens"], b["tokens"])
        assert (b["tokens_head"], b["tokens_tail"]) == (PREFILL, 1)
