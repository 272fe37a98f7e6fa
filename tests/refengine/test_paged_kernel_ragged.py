"""The C++ paged kernels at any head width (issue 32, item 3): ZACK's adaptive ranks give parts
whose K and V widths are ragged (37, 50, 17, 1, different for K and V); decode and prefill must
match gather + SDPA on them, and a ZACK slot of such parts must be served by the kernels, not by
the SDPA fallback. Float32 pools are compared at 1e-5, bfloat16 ones at 2e-2 (the stored values)."""

import shutil

import pytest
import torch

from refengine.attention import build_attn_batch, slot_mapping
from refengine.kv.cache import KVCache, PartKV, paged_op
from refengine.kv.spec import CacheSpec, HeadPart, ModelFacts
from refengine.kv.storage import DenseStore
from refengine.kv.methods.zack.ops import ZackRotate
from refengine.paged_kernel import build

CPU = torch.device("cpu")
pytestmark = pytest.mark.skipif(not shutil.which("c++"), reason="no C++ compiler to build the kernel")
RAGGED = [(2, 3, 37, 50), (1, 4, 1, 17), (3, 2, 50, 37), (1, 2, 17, 1), (2, 2, 64, 37), (1, 3, 37, 64)]


@pytest.fixture(scope="module")
def kernel():
    return build()


def filled(kvh, d, dv, dtype, lengths, bs=4, blocks=150):
    """A dense part with random K/V per sequence in scattered blocks; its block tables."""
    p = PartKV(HeadPart(tuple(range(kvh)), d, dv), DenseStore(blocks, bs, kvh, d, dtype, CPU),
               DenseStore(blocks, bs, kvh, dv, dtype, CPU))
    perm, tables = torch.randperm(blocks).tolist(), []
    for n in lengths:
        table, perm = perm[:-(-n // bs)], perm[-(-n // bs):]
        slots = slot_mapping([(0, n, table)], bs, CPU)
        p.k.write(slots, torch.randn(n, kvh, d))
        p.v.write(slots, torch.randn(n, kvh, dv))
        tables.append(table)
    return p, tables


def close(out, ref, dtype):
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    return out.shape == ref.shape and torch.allclose(out.float(), ref.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("kvh,g,d,dv", RAGGED)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_at_ragged_widths_matches_sdpa(kernel, kvh, g, d, dv, dtype):
    """One entry, a partial block, more than one 64-key tile; query groups of 2-4 rows."""
    torch.manual_seed(5)
    lengths = [1, 5, 70, 130, 17]
    p, tables = filled(kvh, d, dv, dtype, lengths)
    chunks = [(n - 1, 1, t) for n, t in zip(lengths, tables)]
    q = torch.randn(len(lengths), kvh * g, d, dtype=dtype)
    ref = paged_op(q, p, build_attn_batch(chunks, 4, CPU), 0.3)
    out = paged_op(q, p, build_attn_batch(chunks, 4, CPU, decode_kernel=kernel), 0.3)
    assert out.dtype == dtype and close(out, ref, dtype)


@pytest.mark.parametrize("kvh,g,d,dv", RAGGED)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_at_ragged_widths_matches_sdpa(kernel, kvh, g, d, dv, dtype):
    """A whole prompt past one 48-row query tile, a chunk after a cached prefix, a short prompt and
    a decode row in the same step."""
    torch.manual_seed(6)
    lengths = [100, 150, 7, 40]
    p, tables = filled(kvh, d, dv, dtype, lengths)
    chunks = [(0, 100, tables[0]), (71, 79, tables[1]), (0, 7, tables[2]), (39, 1, tables[3])]
    q = torch.randn(sum(n for _, n, _ in chunks), kvh * g, d, dtype=dtype)
    ref = paged_op(q, p, build_attn_batch(chunks, 4, CPU), 0.2)
    out = paged_op(q, p, build_attn_batch(chunks, 4, CPU, prefill_kernel=kernel, decode_kernel=kernel), 0.2)
    assert out.dtype == dtype and close(out, ref, dtype)


class Counting:
    """The kernel, counting its decode and prefill calls and the (d, dv) widths they saw."""

    def __init__(self, inner):
        self.inner, self.decodes, self.prefills = inner, [], []

    def __call__(self, q, k_pool, v_pool, *args):
        self.decodes.append((k_pool.shape[-1], v_pool.shape[-1]))
        return self.inner(q, k_pool, v_pool, *args)

    def prefill(self, q, k_pool, v_pool, *args):
        self.prefills.append((k_pool.shape[-1], v_pool.shape[-1]))
        return self.inner.prefill(q, k_pool, v_pool, *args)


def test_adaptive_zack_slot_is_served_by_the_kernels(kernel):
    """An adaptive-ZACK layout (head_dim 64, per-head ranks K 37/50/37, V 50/17/1: two parts of
    distinct sizes per K and V) through ``SlotKV.attend`` with the engine's rotation: every part's
    prefill and decode go to the C++ kernels (none to gather + SDPA), and the output equals the
    SDPA path's."""
    torch.manual_seed(7)
    kvh, G, d = 3, 3, 64
    facts = ModelFacts("/m", 1, kvh * G, kvh, d, 4, None, 1)
    group = CacheSpec.for_model(facts).groups[0].with_(k_dims=(37, 50, 37), v_dims=(50, 17, 1))
    assert len(group.parts) >= 2 and any(p.v_dim % 16 or p.k_dim % 16 for p in group.parts)
    slot = KVCache(CacheSpec((group,), (0,)), [], num_blocks=64, block_size=4, dtype=torch.float32,
                   device=CPU).slots[0]
    m = torch.linalg.qr(torch.randn(kvh, d, d, dtype=torch.float64))[0]
    slot.transform = ZackRotate(group, m, m, CPU, torch.float32)
    assert all(p.dense_pools() is not None for p in slot.parts)
    tables = [list(range(0, 30)), list(range(30, 60))]
    slot.write(slot_mapping([(0, 100, tables[0]), (0, 90, tables[1])], 4, CPU),
               torch.randn(190, kvh, d), torch.randn(190, group.v_width))
    chunks = [(60, 40, tables[0]), (89, 1, tables[1])]          # a chunk after a prefix + a decode row
    q = torch.randn(41, kvh * G, d)
    ref = slot.attend(q, build_attn_batch(chunks, 4, CPU), 0.125)
    spy = Counting(kernel)
    out = slot.attend(q, build_attn_batch(chunks, 4, CPU, decode_kernel=spy, prefill_kernel=spy), 0.125)
    widths = [(p.part.k_dim, p.part.v_dim) for p in slot.parts]
    assert spy.prefills == widths and spy.decodes == widths
    assert torch.allclose(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.model
def test_adaptive_zack_engine_never_falls_back_to_sdpa(zack_dir, monkeypatch):
    """A served adaptive-ZACK model (ragged per-head ranks) with the kernels on: prefill (in chunks,
    so with a cached prefix) and decode run without gather + SDPA, which is made to fail here."""
    from types import SimpleNamespace

    import refengine.attention as attention
    from refengine.config import EngineConfig
    from refengine.engine import LLMEngine
    from refengine.sampling_params import SamplingParams

    eng = LLMEngine(EngineConfig(model=str(zack_dir), decode_kernel="cpp", prefill_kernel="cpp", max_model_len=256,
                                 num_kv_blocks=32, max_num_batched_tokens=64, enable_prefix_caching=False))
    zack = next(m for m in eng.runner.kv_methods if m.name == "zack")
    assert zack.mode == "adaptive" and any(r % 16 for ranks in zack.k_ranks + zack.v_ranks for r in ranks)

    def no_sdpa(*a, **k):
        raise AssertionError("gather + SDPA used")
    monkeypatch.setattr(attention, "_sdpa", no_sdpa)
    monkeypatch.setattr(attention, "F", SimpleNamespace(scaled_dot_product_attention=no_sdpa))
    out = eng.generate([[1] + [(7 * i) % 4000 + 30 for i in range(99)]], SamplingParams(max_tokens=6, temperature=0))
    assert len(out[0]) == 6
