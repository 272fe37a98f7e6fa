"""The GGUF kernels of csrc/quant_gguf.cpp against the torch references (refengine.quant.formats):
dequantization bit-equal to llama.cpp's reference for every format, the AVX2 activation quantizer
equal to the scalar one, the integer-dot GEMM (AVX2 and scalar) equal to the exact product of the
quantized activations and the dequantized weights up to float32 summation, results independent
of the batch a row runs in, column offsets and bfloat16 outputs."""

import pytest
import torch

from refengine import paged_kernel
from refengine.quant import formats
from refengine.quant.qlinear import GGUFLinear
from refengine.quant.qtensor import QTensor
from tests.refengine.quant.quant_support import random_blocks

FORMATS = sorted(formats.FORMATS)


@pytest.fixture(scope="module")
def k():
    try:
        return paged_kernel.build().module
    except Exception as exc:                       # no compiler here: the engine falls back, say so
        pytest.skip(f"C++ kernels not built: {exc}")


def _impls(k):
    return ([0, 1] if k.gguf_has_avx2() else [1]) + ([2] if k.gguf_has_vnni() else [])


@pytest.mark.parametrize("qtype", FORMATS)
def test_dequant_is_bit_equal_to_reference(k, qtype):
    raw = random_blocks(qtype, 40, 768, seed=4)
    ref = formats.dequantize(qtype, raw, 768)
    got = k.gguf_dequant(raw, formats.FORMATS[qtype].ggml_type, 768)
    assert torch.equal(got.view(torch.int32), ref.view(torch.int32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_activation_quantizer_avx2_equals_scalar(k, dtype):
    x = (torch.randn(9, 512, generator=torch.Generator().manual_seed(5)) * 3).to(dtype)
    x[0] = 0                                        # an all-zero row: scale 0, values 0
    x[1, :32] = torch.tensor([0.5, -0.5, 1.5, -2.5] * 8, dtype=dtype) * (1 / 127)   # ties of the rounding
    a, b = k.act_quant(x, 0), k.act_quant(x, 1)
    for u, v in zip(a, b):
        assert torch.equal(u, v)
    q, d, ds, s16 = a
    assert q.abs().max() <= 127 and torch.equal(d[0], torch.zeros_like(d[0]))
    xq = q.float() * d.repeat_interleave(32, 1)
    assert ((xq - x.float()).abs() <= d.repeat_interleave(32, 1) / 2 + 1e-7).all()      # rounding error
    assert torch.equal(s16, q.reshape(9, -1, 16).int().sum(-1))
    assert torch.allclose(ds, d * q.reshape(9, -1, 32).float().sum(-1))


@pytest.mark.parametrize("qtype", FORMATS)
def test_gemm_equals_exact_product_of_quantized_operands(k, qtype):
    N, K = 70, 512
    raw = formats.quantize(qtype, torch.randn(N, K, generator=torch.Generator().manual_seed(6)) * 0.05)
    x = torch.randn(7, K, generator=torch.Generator().manual_seed(7))
    acts = k.act_quant(x, 0)
    ref = (acts[0].double() * acts[1].double().repeat_interleave(32, 1)) @ formats.dequantize(qtype, raw, K).double().t()
    for impl in _impls(k):
        out = torch.full((7, N + 3), 7.0)
        k.gguf_gemm(*acts, raw, formats.FORMATS[qtype].ggml_type, out, 3, impl)
        assert torch.equal(out[:, :3], torch.full((7, 3), 7.0))           # columns before col0 untouched
        err = (out[:, 3:].double() - ref).abs().max() / ref.abs().max()
        assert err < 2e-6, (impl, err)


@pytest.mark.parametrize("qtype", FORMATS)
def test_gemm_on_every_bit_pattern_and_extreme_activations(k, qtype):
    """Random bytes in every integer field (Q5_0: every qh bit pattern, values 0..31) against activations
    at +-127 (the int16 pair sums' limits) and random ones: the exact product up to float32 summation."""
    N, K = 24, 512
    raw = random_blocks(qtype, N, K, seed=14)
    x = torch.randn(6, K, generator=torch.Generator().manual_seed(15))
    x[0] = 1.0                                                        # every activation 127
    x[1] = -1.0
    x[2, ::2] = 1.0                                                   # +-127 alternating
    x[2, 1::2] = -1.0
    acts = k.act_quant(x, 0)
    xq, w = acts[0].double() * acts[1].double().repeat_interleave(32, 1), formats.dequantize(qtype, raw, K).double()
    ref, scale = xq @ w.t(), xq.abs() @ w.abs().t()                  # scale: the sum of |products|
    outs = {}
    for impl in _impls(k):
        out = torch.empty(6, N)
        k.gguf_gemm(*acts, raw, formats.FORMATS[qtype].ggml_type, out, 0, impl)
        assert ((out.double() - ref).abs() <= 2e-6 * scale).all(), impl
        outs[impl] = out
    if 2 in outs and qtype in ("Q5_0", "Q8_0"):                     # impl 2 runs impl 0's code for these
        assert torch.equal(outs[2], outs[0])


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1"])
def test_vnni_gemm_with_an_odd_block_count(k, qtype):
    """impl 2 takes two 32-value blocks a step: a row of 17 blocks ends on one (masked) block."""
    if not k.gguf_has_vnni():
        pytest.skip("no AVX-512 VNNI here (impl 2 is refused)")
    N, K = 37, 544
    raw = formats.quantize(qtype, torch.randn(N, K, generator=torch.Generator().manual_seed(8)) * 0.05)
    x = torch.randn(5, K, generator=torch.Generator().manual_seed(9))
    acts = k.act_quant(x, 0)
    ref = (acts[0].double() * acts[1].double().repeat_interleave(32, 1)) @ formats.dequantize(qtype, raw, K).double().t()
    out = torch.empty(5, N)
    k.gguf_gemm(*acts, raw, formats.FORMATS[qtype].ggml_type, out, 0, 2)
    assert (out.double() - ref).abs().max() / ref.abs().max() < 2e-6
    one = torch.empty(1, N)                                           # a row alone: the same bits
    k.gguf_gemm(*(a[3:4].contiguous() for a in acts), raw, formats.FORMATS[qtype].ggml_type, one, 0, 2)
    assert torch.equal(one[0], out[3])


@pytest.mark.parametrize("qtype", ["Q4_1", "Q5_0", "Q4_K", "Q6_K"])
def test_rows_do_not_depend_on_the_batch(k, qtype):
    """A row's result is the same bits alone, in a batch of 9 (tiles of 4 and a remainder) and at
    any position: greedy tokens do not change with what runs beside them."""
    K = 512
    lin = GGUFLinear([QTensor.quantize(torch.randn(96, K) * 0.05, qtype)], None, k)
    x = torch.randn(9, K, generator=torch.Generator().manual_seed(8))
    batch = lin(x)
    for i in (0, 4, 8):
        assert torch.equal(lin(x[i:i + 1])[0], batch[i])
    assert torch.equal(lin(x.flip(0)), batch.flip(0))


def test_linear_parts_in_several_formats_and_bf16(k):
    """Fused parts of different formats (a Q4_K_M q/k/v: v in Q6_K) write their own columns; bf16
    in gives bf16 out, equal to float32 rounded once; a bias is added."""
    K = 256
    parts = [QTensor.quantize(torch.randn(n, K) * 0.05, t) for n, t in ((64, "Q4_K"), (32, "Q4_K"), (32, "Q6_K"))]
    bias = torch.randn(128)
    lin = GGUFLinear(parts, bias, k)
    assert lin.formats == ["Q4_K", "Q6_K"]
    x = torch.randn(5, K)
    y = lin(x)
    dense = torch.cat([p.dequantize() for p in parts])
    assert torch.allclose(y, x @ dense.t() + bias, rtol=0.05, atol=0.05 * float((x @ dense.t()).abs().max()))
    for i, p in enumerate(parts):
        alone = GGUFLinear([p], None, k)(x)
        lo = sum(q.shape[0] for q in parts[:i])
        assert torch.equal(alone, y[:, lo:lo + p.shape[0]] - bias[lo:lo + p.shape[0]]) or \
            torch.allclose(alone, y[:, lo:lo + p.shape[0]] - bias[lo:lo + p.shape[0]], atol=1e-6)
    yb = lin(x.bfloat16())
    assert yb.dtype == torch.bfloat16
    assert torch.equal(GGUFLinear(parts, None, k)(x.bfloat16()), GGUFLinear(parts, None, k)(x.bfloat16().float()).bfloat16())
    assert lin(torch.empty(0, K)).shape == (0, 128)


def test_interleaved_rows_keep_every_method_and_the_bits(k):
    """QTensor.interleaved(4): the same blocks in the order the VNNI kernel reads 4 Q4_K rows a step;
    dequantization, row lookup, concatenation and the GEMM give what the stored order gives."""
    K = 512
    q = QTensor.quantize(torch.randn(24, K, generator=torch.Generator().manual_seed(11)) * 0.05, "Q4_K")
    g = q.interleaved(4)
    assert g.group == 4 and not torch.equal(g.raw, q.raw) and torch.equal(g.rows_raw(), q.raw)
    assert torch.equal(g.dequantize(), q.dequantize())
    idx = torch.tensor([5, 0, 23, 5, 12])
    assert torch.equal(g.index_rows(idx).raw, q.index_rows(idx).raw)
    both = QTensor.cat([g, g.to("cpu")])
    assert both.group == 4 and torch.equal(both.rows_raw(), torch.cat([q.raw, q.raw]))
    with pytest.raises(ValueError):
        QTensor.cat([g, q])
    with pytest.raises(ValueError):
        QTensor("Q4_K", q.raw[:6], K, group=4)
    if not k.gguf_has_vnni():
        with pytest.raises(RuntimeError):
            k.gguf_gemm(*k.act_quant(torch.randn(1, K), 0), g.raw, g.ggml_type, torch.empty(1, 24), 0, 0, 4)
        return
    x = torch.randn(9, K, generator=torch.Generator().manual_seed(12))
    acts = k.act_quant(x, 0)
    ref = torch.empty(9, 24)
    k.gguf_gemm(*acts, q.raw, q.ggml_type, ref, 0, 2)
    got = torch.empty(9, 24)
    k.gguf_gemm(*acts, g.raw, g.ggml_type, got, 0, 2, 4)          # rows in 4s (k4_vnni<4, 1>) and alone (<1, 4>)
    assert torch.equal(got, ref)
    for i in (0, 8):                                               # a row alone: the batch's bits
        one = torch.empty(1, 24)
        k.gguf_gemm(*(a[i:i + 1].contiguous() for a in acts), g.raw, g.ggml_type, one, 0, 2, 4)
        assert torch.equal(one[0], ref[i])
    lin, lin_g = GGUFLinear([q], None, k), GGUFLinear([g, g], None, k)
    assert torch.equal(lin_g(x), torch.cat([lin(x), lin(x)], 1))
    with pytest.raises(RuntimeError, match="groups of 4"):        # only Q4_K, impl 2, rows in 4s
        k.gguf_gemm(*acts, g.raw, g.ggml_type, got, 0, 0, 4)


def test_the_plan_interleaves_q4_k_only_where_the_vnni_kernel_runs(k):
    from refengine.quant.plan import QuantPlan

    plan = QuantPlan(torch.float32, "Q8_0", gguf=k)
    q4k = QTensor.quantize(torch.randn(8, 256) * 0.05, "Q4_K")
    assert plan.layout(q4k).group == (4 if k.gguf_has_vnni() else 1)
    assert plan.layout(QTensor.quantize(torch.randn(6, 256) * 0.05, "Q4_K")).group == 1     # rows not in 4s
    assert plan.layout(QTensor.quantize(torch.randn(8, 256) * 0.05, "Q6_K")).group == 1
