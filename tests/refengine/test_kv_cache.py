"""KV cache storage: real 1-byte FP8 storage with per-token scales, slot sharing, byte accounting."""

import torch

from refengine.attention import build_attn_batch, slot_mapping
from refengine.kv_cache import DenseKVCache, Fp8KVCache, KVCache, KVCacheLayout


def test_layout_acrosskv_groups():
    lay = KVCacheLayout.for_model(num_layers=10, swiftkv_layers=4, group_size=3)
    assert lay.layer_slot == [0, 1, 2, 3, 4, 4, 4, 5, 5, 5]
    assert lay.num_slots == 6
    assert KVCacheLayout.for_model(10, None).layer_slot == list(range(10))


def test_shared_slots_are_one_allocation():
    lay = KVCacheLayout.for_model(num_layers=6, swiftkv_layers=2, group_size=2)
    kv = KVCache(lay, num_blocks=8, block_size=4, kv_heads=2, head_dim=8, dtype=torch.float32,
                 device=torch.device("cpu"))
    assert len(kv.slots) == 4
    assert kv.layers[2] is kv.layers[3] and kv.layers[4] is kv.layers[5] and kv.layers[3] is not kv.layers[4]
    assert kv.bytes_per_token == 4 * 2 * 2 * 8 * 4
    assert kv.bytes_per_token == KVCache.bytes_per_token_for(lay, 2, 8, torch.float32)


def test_fp8_storage_is_one_byte_and_accurate():
    torch.manual_seed(0)
    c = Fp8KVCache(16, 4, kv_heads=3, head_dim=64, dtype=torch.float32, device=torch.device("cpu"))
    assert c.k.element_size() == 1 and c.k.dtype == torch.uint8   # raw float8_e4m3fn bytes
    assert c.bytes_per_token == 2 * 3 * (64 + 4)
    k, v = torch.randn(10, 3, 64) * 3, torch.randn(10, 3, 64)
    slots = torch.arange(4, 14)                      # blocks 1..3
    c.write(slots, k, v)
    k2, v2 = (x.flatten(0, 1)[:10] for x in c.gather(torch.tensor([1, 2, 3])))
    rel = ((k2 - k).norm() / k.norm()).item()
    assert rel < 0.05, rel                   # e4m3 has a 3-bit mantissa: ~2-3% relative error
    assert ((v2 - v).norm() / v.norm()).item() < 0.05
    # Outliers in one token do not hurt another token (per-token scales).
    k[0, 0, 0] = 1000.0
    c.write(slots[:1], k[:1], v[:1])
    k3, _ = c.gather(torch.tensor([1]))
    assert torch.allclose(k3[0, 1], k2[1])


def test_fp8_attention_close_to_dense():
    torch.manual_seed(0)
    dense = DenseKVCache(16, 4, 2, 16, torch.float32, torch.device("cpu"))
    fp8 = Fp8KVCache(16, 4, 2, 16, torch.float32, torch.device("cpu"))
    chunks = [(0, 9, [0, 1, 2]), (0, 1, [3])]             # one prefill of 9, one single-token sequence
    slots = slot_mapping(chunks, 4, torch.device("cpu"))
    k, v = torch.randn(10, 2, 16), torch.randn(10, 2, 16)
    for c in (dense, fp8):
        c.write(slots, k, v)
    batch = build_attn_batch(chunks, 4, torch.device("cpu"))
    q = torch.randn(10, 4, 16)
    a, b = dense.attend(q, batch, 0.25), fp8.attend(q, batch, 0.25)
    assert a.shape == (10, 4, 16)
    assert ((a - b).norm() / a.norm()).item() < 0.05


def test_paged_attention_matches_dense_causal():
    """Chunked prefill with an offset mask and padded decode rows equal plain causal attention."""
    torch.manual_seed(0)
    cache = DenseKVCache(32, 4, 2, 8, torch.float32, torch.device("cpu"))
    T = 11
    k, v, q = torch.randn(T, 2, 8), torch.randn(T, 2, 8), torch.randn(T, 4, 8)
    table = [5, 2, 7]                          # scattered blocks
    cache.write(slot_mapping([(0, T, table)], 4, torch.device("cpu")), k, v)
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    s = torch.einsum("qhd,khd->hqk", q, kk) * 0.5
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    ref = torch.einsum("hqk,khd->qhd", s.softmax(-1), vv)
    # positions 6..10 as a chunk that continues a prefix, plus position 3 as a one-token row
    batch = build_attn_batch([(6, 5, table), (3, 1, table)], 4, torch.device("cpu"))
    qq = torch.cat([q[6:11], q[3:4]])
    out = cache.attend(qq, batch, 0.5)
    assert torch.allclose(out[:5], ref[6:11], atol=1e-5)
    assert torch.allclose(out[5], ref[3], atol=1e-5)
