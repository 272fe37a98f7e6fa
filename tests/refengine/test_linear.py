"""Prepacked CPU GEMM weights (refengine/linear.py): same results as F.linear, honest fallbacks,
explicit requests refused where they cannot apply, and the same greedy tokens in the engine; the
bf16 GEMM (csrc/gemm_bf16.cpp) against float32 sums, batch-invariant, on its blocked layout."""

import pytest
import torch
import torch.nn.functional as F

from refengine.config import EngineConfig
from refengine.engine import LLMEngine
from refengine.linear import Bf16Linear, Linear, PackedLinear, bf16_gemm_kernels, make_linear, pack_bf16
from refengine.linear import resolve_packed_linear
from refengine.sampling_params import SamplingParams

needs_packing = pytest.mark.skipif(not isinstance(make_linear(torch.randn(8, 4), None, True), PackedLinear),
                                   reason="oneDNN prepacking unavailable in this torch build")
PACKED = (PackedLinear, Bf16Linear)
needs_bf16_gemm = pytest.mark.skipif(bf16_gemm_kernels() is None,
                                     reason="the bf16 GEMM needs AVX-512-BF16 and the C++ kernels")


@needs_packing
@pytest.mark.parametrize("lead", [(0,), (1,), (7,), (2, 5)])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_matches_f_linear(lead, bias, dtype):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(96, 40, generator=g).to(dtype)
    b = torch.randn(96, generator=g).to(dtype) if bias else None
    mod = make_linear(w, b, True)
    if not isinstance(mod, PACKED) and dtype == torch.bfloat16:
        pytest.skip(f"no bfloat16 prepacking here: {mod.note}")        # AVX2-only CPUs
    # bf16 on AVX-512-BF16 CPUs: the project's GEMM; elsewhere oneDNN's layout
    assert isinstance(mod, Bf16Linear if dtype == torch.bfloat16 and bf16_gemm_kernels() else PackedLinear)
    x = torch.randn(*lead, 40, generator=g).to(dtype)
    y = mod(x)
    assert y.shape == (*lead, 96) and y.dtype == dtype
    # float32: a few ulp of summation order; bfloat16: both round float32 sums once (<= 1 ulp, 2^-8 relative)
    tol = dict(rtol=1e-5, atol=1e-4) if dtype == torch.float32 else dict(rtol=8e-3, atol=3e-2)
    torch.testing.assert_close(y.float(), F.linear(x, w, b).float(), **tol)


def test_fallbacks_keep_f_linear_and_say_why():
    w = torch.randn(16, 8)
    plain = make_linear(w, None, False)
    assert isinstance(plain, Linear) and plain.note == ""
    fp16 = make_linear(w.half(), None, True)
    assert isinstance(fp16, Linear) and "dtype" in fp16.note


def test_packed_linear_option_resolution():
    cpu = torch.device("cpu")
    assert resolve_packed_linear("auto", cpu, torch.bfloat16) == "all"
    assert resolve_packed_linear("auto", cpu, torch.float16) == "off"
    assert resolve_packed_linear("off", cpu, torch.float32) == "off"
    assert resolve_packed_linear("lm_head", cpu, torch.float32) == "lm_head"
    assert resolve_packed_linear("all", cpu, torch.bfloat16) == "all"
    with pytest.raises(ValueError, match="CPU float32 or bfloat16"):
        resolve_packed_linear("all", cpu, torch.float16)
    with pytest.raises(ValueError, match="not in"):
        resolve_packed_linear("fast", cpu, torch.float32)


@needs_packing
@pytest.mark.model
def test_engine_greedy_tokens_identical_packed_or_not(smollm2_dir):
    prompt = [1, 504, 3458, 282, 4649, 314]            # token ids; the engine does not tokenise
    outs = {}
    for mode in ("off", "all"):
        eng = LLMEngine(EngineConfig(model=str(smollm2_dir), packed_linear=mode, max_model_len=256,
                                     kv_cache_memory_gb=0.05))
        packed = sum(isinstance(m, PACKED) for m in eng.runner.model.modules())
        assert (packed > 0) == (mode == "all")
        eng.add_request("r", prompt, SamplingParams(max_tokens=16, temperature=0))
        toks: list[int] = []
        while eng.has_unfinished():
            for o in eng.step():
                toks += o.new_token_ids
        outs[mode] = toks
    assert len(outs["off"]) == 16 and outs["off"] == outs["all"]


def test_pack_bf16_layout():
    w = torch.arange(70 * 6, dtype=torch.float32).view(70, 6).to(torch.bfloat16)
    p = pack_bf16(w)
    assert p.shape == (2, 3, 4, 16, 2)                        # 2 units of 4 blocks of 16 outputs
    for u, q, b, i, j in ((0, 0, 0, 0, 1), (0, 2, 3, 15, 0), (0, 1, 1, 3, 1), (1, 2, 0, 5, 1)):
        assert p[u, q, b, i, j] == w[16 * (4 * u + b) + i, 2 * q + j]
    assert p[1, :, 0, 6:].abs().sum() == 0 and p[1, :, 1:].abs().sum() == 0    # rows past n are zeros


@needs_bf16_gemm
@pytest.mark.parametrize("n, k", [(96, 40), (17, 64), (1000, 576), (64, 2)])
@pytest.mark.parametrize("bias", [False, True])
def test_bf16_gemm_matches_float32_sums_and_is_batch_invariant(n, k, bias):
    g = torch.Generator().manual_seed(n + k)
    w = torch.randn(n, k, generator=g).to(torch.bfloat16)
    b = torch.randn(n, generator=g).to(torch.bfloat16) if bias else None
    mod = make_linear(w, b, True)
    assert isinstance(mod, Bf16Linear)
    x = torch.randn(37, k, generator=g).to(torch.bfloat16)
    y = mod(x)
    ref = x.float() @ w.float().T + (b.float() if bias else 0)
    # float32 sums of exact bf16 products, rounded once: within a bf16 ulp (2^-8 relative) of ref
    torch.testing.assert_close(y.float(), ref, rtol=8e-3, atol=1e-2)
    # every row the same bits alone, in any batch (tiles of 6 rows, units of 64 outputs)
    for rows in ((0, 1), (5, 12), (30, 37), (0, 37)):
        assert torch.equal(mod(x[rows[0]:rows[1]]), y[rows[0]:rows[1]])
    assert mod(x[:0]).shape == (0, n) and mod(x.view(37, 1, k)).shape == (37, 1, n)


@needs_bf16_gemm
def test_bf16_gemm_refuses_a_mismatched_weight():
    k = bf16_gemm_kernels()
    with pytest.raises(RuntimeError, match="packed weight"):
        k.bf16_gemm(torch.zeros(2, 8, dtype=torch.bfloat16), pack_bf16(torch.zeros(16, 10, dtype=torch.bfloat16)), 16)
    odd = make_linear(torch.zeros(16, 9, dtype=torch.bfloat16), None, True)
    assert not isinstance(odd, Bf16Linear)                    # an odd K has no pairs: oneDNN's layout
