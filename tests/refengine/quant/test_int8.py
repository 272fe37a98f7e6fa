"""int8 W8A8 (refengine.quant.int8): the compressed-tensors scheme read and refused, oneDNN's int8
GEMM exact with the activation range picked for this CPU, ``Int8Linear`` against the float product
of its quantized operands, and a tiny model through ``modelkit quantize`` (with and without
SmoothQuant) served by the engine next to its float original."""

import copy
import json

import pytest
import torch

from refengine.config import EngineConfig
from refengine.engine import LLMEngine
from refengine.quant.int8 import Int8Kernels, Int8Linear, Int8Weight, w8a8_scheme
from tests.refengine.quant.quant_support import write_tiny_llama

MAX_DIFF = 0.5   # per position, at qmax 127 (doubled at 63 below)


@pytest.fixture(scope="module")
def kernels():
    try:
        return Int8Kernels()
    except RuntimeError as exc:
        pytest.skip(str(exc))


def test_scheme_read_and_refused():
    from modelkit.quantize import quantization_config

    ok = {"quantization_config": quantization_config(["lm_head"])}
    assert w8a8_scheme(ok)["format"] == "int-quantized"
    assert w8a8_scheme({}) is None
    fp8 = copy.deepcopy(ok)
    fp8["quantization_config"]["config_groups"]["group_0"]["weights"]["type"] = "float"
    with pytest.raises(ValueError, match="weights"):
        w8a8_scheme(fp8)
    static = copy.deepcopy(ok)
    static["quantization_config"]["config_groups"]["group_0"]["input_activations"]["dynamic"] = False
    with pytest.raises(ValueError, match="input_activations"):
        w8a8_scheme(static)
    with pytest.raises(ValueError, match="awq"):
        w8a8_scheme({"quantization_config": {"quant_method": "awq"}})


def test_int8_linear_is_the_product_of_its_quantized_operands(kernels):
    w = Int8Weight.quantize(torch.randn(96, 320) * 0.05)
    bias = torch.randn(96)
    lin = Int8Linear(w, bias, kernels)
    x = torch.randn(5, 320)
    x[0, 7] = 40.0                                                     # an outlier channel
    xq, sx = kernels.quant_rows(x)
    exact = (xq.double() @ w.q.double().t()) * w.scale.double() * sx.double().unsqueeze(1) + bias.double()
    y = lin(x)
    assert torch.allclose(y.double(), exact, rtol=1e-5, atol=1e-5 * float(exact.abs().max()))
    assert xq.abs().max() <= kernels.qmax
    assert lin(x.bfloat16()).dtype == torch.bfloat16 and lin(torch.empty(0, 320)).shape == (0, 96)
    assert torch.equal(lin(x[2:3])[0], y[2])                           # rows independent of the batch


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_bias", [False, True])
def test_fused_row_kernels_equal_the_torch_code(kernels, dtype, with_bias):
    """The C++ quantize / rescale (one pass each) give the torch code's bits: the same u8 values and
    scales (ties rounded to even, an all-zero row, an odd width's tail), the same outputs."""
    if kernels.cpp is None:
        pytest.skip("C++ kernels not built: the torch code runs")
    torch_only = copy.copy(kernels)
    torch_only.cpp = None
    w = Int8Weight.quantize(torch.randn(72, 333) * 0.05)
    bias = torch.randn(72).to(dtype) if with_bias else None
    x = (torch.randn(9, 333) * 3).to(dtype)
    x[0] = 0
    x[1, :6] = torch.tensor([0.5, -0.5, 1.5, -2.5, 2.5, 100.0]).to(dtype)
    xq, sx = kernels.quant_rows(x)
    xu, sx2 = kernels.cpp.int8_quant_rows(x, kernels.qmax)
    assert torch.equal(sx, sx2) and torch.equal((xq + kernels.qmax + 1).to(torch.uint8), xu)
    packed = kernels.prepack(w.q, [1, 333])
    b32 = bias.float() if bias is not None else None
    got, ref = kernels.linear(x, packed, w.scale, b32), torch_only.linear(x, packed, w.scale, b32)
    assert got.dtype == dtype and torch.equal(got, ref)


def test_smoothing_changes_nothing_in_float():
    from modelkit.quantize import _smooth

    g = torch.Generator().manual_seed(0)
    x, norm = torch.randn(6, 32, generator=g), torch.rand(32, generator=g) + 0.5
    state = {"n": norm.clone(), "a": torch.randn(8, 32, generator=g), "b": torch.randn(4, 32, generator=g)}
    before = [(x * norm) @ state[k].t() for k in ("a", "b")]
    _smooth(state, ["a", "b"], "n", None, x.abs().amax(0) * 10, 0.5, 0.0)
    after = [(x * state["n"]) @ state[k].t() for k in ("a", "b")]
    assert all(torch.allclose(u, v, atol=1e-5) for u, v in zip(before, after))
    up, down, h = torch.randn(16, 8, generator=g), torch.randn(8, 16, generator=g), torch.randn(3, 8, generator=g)
    st = {"up.weight": up.clone(), "down": down.clone()}
    _smooth(st, ["down"], None, "up.weight", torch.rand(16, generator=g) + 1, 0.5, 0.0)
    assert torch.allclose(((h @ up.t()) * 0.7) @ down.t(), ((h @ st["up.weight"].t()) * 0.7) @ st["down"].t(), atol=1e-5)


@pytest.mark.parametrize("smooth", [0.0, 0.5])
def test_quantized_tiny_model_served_close_to_float(kernels, tmp_path, smooth, monkeypatch):
    import modelkit.quantize as mq

    src = tmp_path / "src"
    src.mkdir()
    write_tiny_llama(src, "Q8_0")
    (src / "tiny.gguf").unlink()
    if smooth:     # calibration text: token ids of a fixed sequence (the tiny model has no tokenizer)
        monkeypatch.setattr("modelkit.zack_calibrate.calibration_sequences",
                            lambda tok, tokens, seq_len, seed, corpus: [list(range(3, 3 + seq_len))] * 2)
        monkeypatch.setattr("transformers.AutoTokenizer.from_pretrained", lambda *a, **k: None)
    out = mq.quantize_w8a8(src, tmp_path / "w8a8", smooth=smooth, tokens=128, seq_len=64, progress=False)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "compressed-tensors"
    kw = dict(dtype="float32", max_model_len=256, kv_cache_memory_gb=0.05)
    prompt = list(range(5, 60))
    ref = LLMEngine(EngineConfig(model=str(src), **kw)).score([(prompt[:4], prompt[4:])])[0]
    eng = LLMEngine(EngineConfig(model=str(out), **kw))
    assert isinstance(eng.runner.model.layers[0].qkv_proj, Int8Linear)
    got = eng.score([(prompt[:4], prompt[4:])])[0]
    diffs = [abs(a[0] - b[0]) for a, b in zip(ref, got)]
    # Activation rounding noise is proportional to the step, max|x| / qmax: qmax is 127 with VNNI and
    # 63 without (7 bits keep oneDNN's int16 pair sums exact, refengine/quant/int8.py). Measured on
    # an AVX2 Zen 3 (qmax 63): mean 0.15 (smooth 0) to 0.19 (smooth 0.5); a wrong scale or a
    # mis-wired layer moves these random-model log-probs by whole nats.
    step = 127 / kernels.qmax
    assert sum(diffs) / len(diffs) < 0.12 * step and max(diffs) < MAX_DIFF * step, (kernels.qmax, diffs)


def test_smoothing_statistics_cover_every_row_of_a_swiftkv_model(smollm2_dir, tmp_path, monkeypatch):
    """``activation_maxima`` prefills with prompt log-probs (one pass a sequence); its statistics
    equal those of teacher-forcing every token as a decode step (the slow way it replaced), the
    SwiftKV later layers' inputs included."""
    import modelkit.quantize as mq
    from modelkit.swiftkv import write_swiftkv_checkpoint

    model = write_swiftkv_checkpoint(smollm2_dir, tmp_path / "swiftkv-l15-g2", 15, 2)
    seqs = [[1] + list(range(1000 + 37 * k, 1063 + 37 * k)) for k in range(3)]
    monkeypatch.setattr("modelkit.zack_calibrate.calibration_sequences", lambda *a: seqs)
    got = mq.activation_maxima(model, 192, 64, None, progress=False)

    eng = LLMEngine(EngineConfig(model=str(model), dtype="float32", packed_linear="off", max_model_len=66,
                                 max_num_seqs=8, kv_cache_memory_gb=0.5))
    want: dict = {}
    mq.watch_linear_inputs(eng.runner.model, want)
    eng.score([(s[:1], s[1:]) for s in seqs])
    assert set(got) == set(want) and len(want) == 90
    worst = max(float((got[k] - want[k]).abs().max() / want[k].abs().max()) for k in want)
    assert worst < 1e-4, worst          # 2e-6 measured (float32 sums in another order)
