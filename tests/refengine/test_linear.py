"""Prepacked CPU GEMM weights (refengine/linear.py): same results as F.linear, honest fallbacks,
explicit requests refused where they cannot apply, and the same greedy tokens in the engine."""

import pytest
import torch
import torch.nn.functional as F

from refengine.config import EngineConfig
from refengine.engine import LLMEngine
from refengine.linear import Linear, PackedLinear, make_linear
from refengine.linear import resolve_packed_linear
from refengine.sampling_params import SamplingParams

needs_packing = pytest.mark.skipif(not isinstance(make_linear(torch.randn(8, 4), None, True), PackedLinear),
                                   reason="oneDNN prepacking unavailable in this torch build")


@needs_packing
@pytest.mark.parametrize("lead", [(0,), (1,), (7,), (2, 5)])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_matches_f_linear(lead, bias, dtype):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(96, 40, generator=g).to(dtype)
    b = torch.randn(96, generator=g).to(dtype) if bias else None
    mod = make_linear(w, b, True)
    if not isinstance(mod, PackedLinear) and dtype == torch.bfloat16:
        pytest.skip(f"no bfloat16 prepacking here: {mod.note}")        # AVX2-only CPUs
    assert isinstance(mod, PackedLinear)
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
        packed = sum(isinstance(m, PackedLinear) for m in eng.runner.model.modules())
        assert (packed > 0) == (mode == "all")
        eng.add_request("r", prompt, SamplingParams(max_tokens=16, temperature=0))
        toks: list[int] = []
        while eng.has_unfinished():
            for o in eng.step():
                toks += o.new_token_ids
        outs[mode] = toks
    assert len(outs["off"]) == 16 and outs["off"] == outs["all"]
