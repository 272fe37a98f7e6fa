"""refengine.fused_ops: the fused C++ element-wise ops against their torch definitions (row
tails that are not a multiple of 16, strided views, in-place contracts), the torch fallback for
what the kernels do not read, and option resolution."""

import shutil

import pytest
import torch

from refengine.fused_ops import TORCH_OPS, CppOps, resolve_fused_ops
from refengine.rope import Rope

CPU = torch.device("cpu")
pytestmark = pytest.mark.skipif(not shutil.which("c++"), reason="no C++ compiler to build the kernels")


@pytest.fixture(scope="module")
def ops():
    o = resolve_fused_ops("cpp", CPU)
    assert isinstance(o, CppOps)
    return o


def close(a, b, tol=1e-5):
    return a.shape == b.shape and a.dtype == b.dtype and torch.allclose(a, b, atol=tol, rtol=tol)


@pytest.mark.parametrize("n", [576, 37, 16])
def test_rms_norm_and_add(ops, n):
    torch.manual_seed(0)
    wide = torch.randn(9, n + 5) * 3
    x, w = wide[:, 2:n + 2], torch.randn(n)                 # rows with a stride, not contiguous
    assert close(ops.rms_norm(x, w, 1e-5), TORCH_OPS.rms_norm(x, w, 1e-5))
    r = torch.randn(9, n)
    want_sum, want_norm = TORCH_OPS.add_rms_norm(x, r.clone(), w, 1e-5)
    before = x.clone()
    got_sum, got_norm = ops.add_rms_norm(x, r, w, 1e-5)
    assert torch.equal(got_sum, want_sum) and close(got_norm, want_norm)
    assert got_sum.data_ptr() == r.data_ptr() and torch.equal(x, before)   # the sum reuses r, h untouched


@pytest.mark.parametrize("d", [64, 8, 40])
def test_rope_in_place_on_a_projection_view(ops, d):
    torch.manual_seed(1)
    rope = Rope(d, 10000.0, {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 64}, 512,
                torch.float32, CPU)
    cos, sin = rope.tables(torch.randint(0, 512, (11,)))
    qkv = torch.randn(11, 5 * d)
    q = qkv[:, d:4 * d].view(11, 3, d)
    want = Rope.apply(q.clone(), cos, sin)
    got = ops.rope(q, cos, sin)
    assert close(got, want) and got.data_ptr() == q.data_ptr()
    assert torch.equal(qkv[:, :d], qkv[:, :d].clone())     # only the view's columns change


@pytest.mark.parametrize("m", [1536, 20])
def test_silu_mul(ops, m):
    torch.manual_seed(2)
    gu = torch.randn(7, 2 * m) * torch.logspace(-1, 1.6, 7)[:, None]        # rows from ~0.1 to ~40
    gu[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -0.0])
    assert close(ops.silu_mul(gu), TORCH_OPS.silu_mul(gu), tol=2e-5)


def bf16_close(got, want):
    """Within one bf16 ulp (2^-8 relative) of torch's bf16 result, and bitwise equal for most elements."""
    assert got.shape == want.shape and got.dtype == want.dtype == torch.bfloat16
    g, w = got.float(), want.float()
    assert torch.allclose(g, w, rtol=2 ** -7, atol=1e-6)
    assert (g == w).float().mean() > 0.95


@pytest.mark.parametrize("n", [576, 37])
def test_bf16_rows_round_where_torch_rounds(ops, n):
    torch.manual_seed(4)
    wide = (torch.randn(9, n + 5) * 3).bfloat16()
    x, w = wide[:, 2:n + 2], torch.randn(n).bfloat16()
    bf16_close(ops.rms_norm(x, w, 1e-5), TORCH_OPS.rms_norm(x, w, 1e-5))
    r = torch.randn(9, n).bfloat16()
    want_sum, want_norm = TORCH_OPS.add_rms_norm(x, r.clone(), w, 1e-5)
    got_sum, got_norm = ops.add_rms_norm(x, r, w, 1e-5)
    assert torch.equal(got_sum, want_sum) and got_sum.data_ptr() == r.data_ptr()     # one rounding, both
    bf16_close(got_norm, want_norm)
    gu = (torch.randn(5, 2 * n) * 4).bfloat16()
    bf16_close(ops.silu_mul(gu), TORCH_OPS.silu_mul(gu))
    rope = Rope(64, 10000.0, None, 256, torch.bfloat16, CPU)
    cos, sin = rope.tables(torch.randint(0, 256, (7,)))
    q = torch.randn(7, 3, 64).bfloat16()
    want = Rope.apply(q.clone(), cos, sin)
    got = ops.rope(q, cos, sin)
    assert got.data_ptr() == q.data_ptr()
    # torch rounds x*cos, rot*sin and their sum; the kernel rounds once: within 2 bf16 ulps of the row scale
    assert torch.allclose(got.float(), want.float(), rtol=2 ** -7, atol=2 ** -7 * float(want.abs().max()))


def test_what_the_kernels_cannot_read_takes_torch(ops):
    """float16, mixed dtypes and non-contiguous rows give exactly torch's results (the same code path)."""
    torch.manual_seed(3)
    x, w = torch.randn(4, 32, dtype=torch.float16), torch.randn(32, dtype=torch.float16)
    assert torch.equal(ops.rms_norm(x, w, 1e-6), TORCH_OPS.rms_norm(x, w, 1e-6))
    s, n = ops.add_rms_norm(x, x.clone(), w, 1e-6)
    assert [torch.equal(a, b) for a, b in zip((s, n), TORCH_OPS.add_rms_norm(x, x.clone(), w, 1e-6))] == [True, True]
    xb, wf = torch.randn(4, 32, dtype=torch.bfloat16), torch.randn(32)          # bf16 rows, float32 weight
    assert torch.equal(ops.rms_norm(xb, wf, 1e-6), TORCH_OPS.rms_norm(xb, wf, 1e-6))
    gu = torch.randn(64, 4).t()                               # elements not contiguous
    assert torch.equal(ops.silu_mul(gu), TORCH_OPS.silu_mul(gu))
    rope = Rope(16, 10000.0, None, 32, torch.float16, CPU)
    cos, sin = rope.tables(torch.arange(3))
    q = torch.randn(3, 2, 16, dtype=torch.float16)
    assert torch.equal(ops.rope(q, cos, sin), Rope.apply(q, cos, sin))


def test_resolution():
    assert resolve_fused_ops("torch", CPU) is TORCH_OPS
    assert resolve_fused_ops("auto", torch.device("cuda")) is TORCH_OPS
    with pytest.raises(ValueError, match="CPU kernel"):
        resolve_fused_ops("cpp", torch.device("cuda"))
    with pytest.raises(ValueError, match="not in"):
        resolve_fused_ops("fast", CPU)
