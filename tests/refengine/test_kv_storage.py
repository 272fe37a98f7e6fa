"""KV storage codecs and the cache built from a spec: real 1-byte FP8 storage with per-token
scales, slot sharing (AcrossKV) as one allocation, byte accounting, paged attention."""

import torch

from refengine.attention import build_attn_batch, slot_mapping
from refengine.kv.cache import KVCache, PartKV, paged_op
from refengine.kv.spec import CacheSpec, HeadPart, ModelFacts
from refengine.kv.storage import DenseStore, Fp8Store

CPU = torch.device("cpu")


def facts(layers=10, swiftkv=None, g=1, kvh=2, heads=4, d=8, elem=4):
    return ModelFacts("/m", layers, heads, kvh, d, elem, swiftkv, g)


def part(codec, blocks, bs, kvh, d):
    store = DenseStore if codec == "dense" else Fp8Store
    return PartKV(HeadPart(tuple(range(kvh)), d, d), store(blocks, bs, kvh, d, torch.float32, CPU),
                  store(blocks, bs, kvh, d, torch.float32, CPU))


def test_layout_acrosskv_groups():
    spec = CacheSpec.for_model(facts(layers=10, swiftkv=4, g=3))
    assert spec.layer_slot == (0, 1, 2, 3, 4, 4, 4, 5, 5, 5)
    assert spec.num_slots == 6 and spec.groups[4].layers == (4, 5, 6)
    assert CacheSpec.for_model(facts(layers=10)).layer_slot == tuple(range(10))


def test_shared_slots_are_one_allocation():
    spec = CacheSpec.for_model(facts(layers=6, swiftkv=2, g=2))
    kv = KVCache(spec, [], num_blocks=8, block_size=4, dtype=torch.float32, device=CPU)
    assert len(kv.slots) == 4
    assert kv.layers[2] is kv.layers[3] and kv.layers[4] is kv.layers[5] and kv.layers[3] is not kv.layers[4]
    assert kv.bytes_per_token == 4 * 2 * 2 * 8 * 4 == spec.device_bytes_per_token


def test_fp8_storage_is_one_byte_and_accurate():
    torch.manual_seed(0)
    s = Fp8Store(16, 4, heads=3, dims=64, dtype=torch.float32, device=CPU)
    assert s.data.element_size() == 1 and s.data.dtype == torch.uint8   # raw float8_e4m3fn bytes
    assert s.bytes_per_token == 3 * (64 + 4)
    k = torch.randn(10, 3, 64) * 3
    slots = torch.arange(4, 14)                      # blocks 1..3
    s.write(slots, k)
    k2 = s.gather(torch.tensor([1, 2, 3])).flatten(0, 1)[:10]
    assert ((k2 - k).norm() / k.norm()).item() < 0.05   # e4m3 has a 3-bit mantissa: ~2-3% relative error
    assert torch.equal(s.rows(slots), k2)
    # Outliers in one token do not hurt another token (per-token scales).
    k[0, 0, 0] = 1000.0
    s.write(slots[:1], k[:1])
    assert torch.allclose(s.gather(torch.tensor([1]))[0, 1], k2[1])


def test_store_move_copies_token_slots():
    for cls in (DenseStore, Fp8Store):
        s = cls(4, 4, 2, 8, torch.float32, CPU)
        x = torch.randn(16, 2, 8)
        s.write(torch.arange(16), x)
        before = s.rows(torch.tensor([9, 14]))
        s.move(torch.tensor([9, 14]), torch.tensor([0, 1]))
        assert torch.equal(s.rows(torch.tensor([0, 1])), before)


def test_fp8_attention_close_to_dense():
    torch.manual_seed(0)
    dense, fp8 = part("dense", 16, 4, 2, 16), part("fp8", 16, 4, 2, 16)
    chunks = [(0, 9, [0, 1, 2]), (0, 1, [3])]             # one prefill of 9, one single-token sequence
    slots = slot_mapping(chunks, 4, CPU)
    k, v = torch.randn(10, 2, 16), torch.randn(10, 2, 16)
    for p in (dense, fp8):
        p.k.write(slots, k)
        p.v.write(slots, v)
    batch = build_attn_batch(chunks, 4, CPU)
    q = torch.randn(10, 4, 16)
    a, b = paged_op(q, dense, batch, 0.25), paged_op(q, fp8, batch, 0.25)
    assert a.shape == (10, 4, 16)
    assert ((a - b).norm() / a.norm()).item() < 0.05


def test_paged_attention_matches_dense_causal():
    """Chunked prefill with an offset mask and padded decode rows equal plain causal attention."""
    torch.manual_seed(0)
    p = part("dense", 32, 4, 2, 8)
    T = 11
    k, v, q = torch.randn(T, 2, 8), torch.randn(T, 2, 8), torch.randn(T, 4, 8)
    table = [5, 2, 7]                          # scattered blocks
    slots = slot_mapping([(0, T, table)], 4, CPU)
    p.k.write(slots, k)
    p.v.write(slots, v)
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    s = torch.einsum("qhd,khd->hqk", q, kk) * 0.5
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    ref = torch.einsum("hqk,khd->qhd", s.softmax(-1), vv)
    # positions 6..10 as a chunk that continues a prefix, plus position 3 as a one-token row
    batch = build_attn_batch([(6, 5, table), (3, 1, table)], 4, CPU)
    out = paged_op(torch.cat([q[6:11], q[3:4]]), p, batch, 0.5)
    assert torch.allclose(out[:5], ref[6:11], atol=1e-5)
    assert torch.allclose(out[5], ref[3], atol=1e-5)
