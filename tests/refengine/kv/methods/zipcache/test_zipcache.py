"""ZipCache: bit packing, the layout's byte arithmetic, quantisation error by precision, the
folded decode attention, and saliency (normalised attention score) on a hand-made pattern."""

import pytest
import torch
from kv_slot_support import OneSlot, reference

from refengine.kv.methods.zipcache.method import ZipCacheMethod
from refengine.kv.methods.zipcache.layout import ZipLayout
from refengine.kv.methods.zipcache.store import pack, unpack


@pytest.mark.parametrize("bits", [2, 4, 8, 16])
@pytest.mark.parametrize("d", [64, 37, 3])
def test_pack_unpack_round_trip(bits, d):
    g = torch.Generator().manual_seed(bits * 100 + d)
    codes = torch.randint(0, 1 << bits, (5, 3, d), generator=g)
    packed = pack(codes, bits)
    assert packed.dtype == torch.uint8 and packed.shape[-1] == -(-d * bits // 8)   # really packed
    assert torch.equal(unpack(packed, bits, d), codes)


def test_pack_puts_the_first_code_in_the_low_bits():
    assert pack(torch.tensor([[1, 2, 3, 0]]), 2).tolist() == [[1 | 2 << 2 | 3 << 4]]
    assert pack(torch.tensor([[15, 1]]), 4).tolist() == [[15 | 1 << 4]]
    assert pack(torch.tensor([[258]]), 16).tolist() == [[2, 1]]


def test_layout_bytes_match_the_allocated_tensors():
    lay = ZipLayout(4, 2, 4, 16)
    # K: 4 slots x 32 B + 12 x 16 B + 16 slot bytes + 2 x 64 fp16; V: data + 64 + 2 x 16 fp16 (K's map)
    assert lay.block_bytes(64, 16, "k") == 4 * 32 + 12 * 16 + 16 + 2 * 64 * 2
    assert lay.block_bytes(64, 16, "v") == 4 * 32 + 12 * 16 + (64 + 32) * 2
    for opts in ({}, {"bits_hi": 8, "bits_lo": 8}, {"bits_hi": 16, "bits_lo": 2, "salient_ratio": 0.5}):
        s = OneSlot([ZipCacheMethod({"window": 0, **opts})], d=37)
        for part in s.slot.parts:
            for store, which in ((part.k, "k"), (part.v, "v")):
                per = sum(t[0].numel() * t.element_size() for t in store.tensors())
                assert per == s.kv.spec.groups[0].codec_args.block_bytes(37, 4, which) * 2   # 2 heads
        assert s.kv.bytes_per_block == s.kv.spec.device_bytes_per_block


def _run(opts, T=16, seed=0, kvh=2, G=2, d=8):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(T, h, d, generator=g) for h in (kvh * G, kvh, kvh))
    s = OneSlot([ZipCacheMethod({"window": 0, **opts})], kvh=kvh, G=G, d=d)
    s.step(q[:T - 4], k[:T - 4], v[:T - 4], 0)           # a prefill; its full blocks are quantised after the step
    return s, q, k, v


def test_error_shrinks_with_bits_and_salient_tokens_get_the_high_precision():
    errs = {}
    for bits in ((2, 2), (4, 4), (8, 8)):
        s, q, k, v = _run({"bits_hi": bits[0], "bits_lo": bits[1]})
        part = s.slot.parts[0]
        blocks = torch.tensor(s.table[:3])
        errs[bits] = (part.k.gather(blocks).flatten(0, 1)[:12] - k[:12]).abs().max().item()
    assert errs[(8, 8)] < errs[(4, 4)] < errs[(2, 2)]
    # K's per-channel grid: at most half a step of the block's channel range
    s, q, k, v = _run({"bits_hi": 4, "bits_lo": 2, "salient_ratio": 0.5})
    part = s.slot.parts[0]
    blocks = torch.tensor(s.table[:3])
    got = part.k.gather(blocks)[:, :, :, :]                                  # [3, 4, kvh, d]
    true = k[:12].view(3, 4, 2, 8)
    rng = true.amax(1, keepdim=True) - true.amin(1, keepdim=True)
    slot_of = part.k.slot_of[blocks].long()                                 # [3, 4, kvh]: < 2 = salient slot
    step = torch.where((slot_of < 2).unsqueeze(-1), rng / 15, rng / 3)
    assert ((got - true).abs() <= step / 2 + 1e-3 * rng).all()
    assert ((slot_of < 2).sum(1) == 2).all()                                # exactly n_hi per block and head


def test_sixteen_bits_is_lossless_to_float32_noise_and_decode_folding_is_exact():
    s, q, k, v = _run({"bits_hi": 16, "bits_lo": 16})
    T, scale = 16, 8 ** -0.5
    for i in range(12, T):                                                   # decodes over packed blocks
        out = s.step(q[i:i + 1], k[i:i + 1], v[i:i + 1], i)
        assert torch.allclose(out, reference(q[i:i + 1], k[:i + 1], v[:i + 1], i, scale)[:, :, :], atol=2e-4)
    # the folded decode equals SDPA over the dequantised blocks, at any precision
    s, q, k, v = _run({"bits_hi": 4, "bits_lo": 2})
    part = s.slot.parts[0]
    out = s.step(q[12:13], k[12:13], v[12:13], 12)
    blocks = torch.tensor(s.table[:4])
    kk, vv = part.k.gather(blocks).flatten(0, 1)[:13], part.v.gather(blocks).flatten(0, 1)[:13]
    assert torch.allclose(out, reference(q[12:13], kk, vv, 12, scale), atol=1e-5)


def test_saliency_is_the_normalised_attention_score():
    """One block of 4 tokens, one head, every query a probe. Token 0 takes a little attention from
    all four queries, token 3 a lot from the only query that sees it: the column sum ranks token 0
    first, the normalised score (divided by the queries that can see the token) token 3."""
    d = 4
    e = torch.eye(d)
    k = torch.stack([e[0], e[1] * 0.1, e[1] * 0.1, e[2]]).view(4, 1, d)
    q = torch.stack([e[0] * 4, e[0] * 0.5, e[0] * 0.5, e[2] * 6]).view(4, 1, d)
    v = torch.randn(4, 1, d)
    m = ZipCacheMethod({"window": 4, "probe_ratio": 1.0, "salient_ratio": 0.25})
    s = OneSlot([m], kvh=1, G=1, d=d)
    s.step(q, k, v, 0, scale=1.0)                                            # window 4: still staged
    ks = s.slot.parts[0].k
    entry = s.kv.methods[0].state.stage_of[s.table[0]]
    a = reference_probs(q, k)                                                # [4 queries, 4 keys]
    assert torch.allclose(ks.sal[entry, :, 0], a.sum(0), atol=1e-6)
    assert ks.cnt[entry].tolist() == [4, 3, 2, 1]
    assert a.sum(0).argmax() == 0 and (a.sum(0) / torch.tensor([4., 3, 2, 1])).argmax() == 3
    salient = ZipCacheMethod._salient(ks, entry.view(1), 1)
    assert salient[0, :, 0].tolist() == [False, False, False, True]


def reference_probs(q, k):
    s = q[:, 0] @ k[:, 0].T
    return s.masked_fill(torch.ones(4, 4, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)


def test_window_keeps_recent_tokens_in_full_precision():
    s, q, k, v = _run({"window": 6}, seed=3)                                 # 12 tokens, window 6
    m = s.kv.methods[0]
    staged = [b for b in s.table[:3] if int(m.state.stage_of[b]) >= 0]
    assert staged == s.table[1:3]                                            # block 0 left; 1 and 2 are recent
    part = s.slot.parts[0]
    assert torch.equal(part.k.gather(torch.tensor(s.table[1:3])).flatten(0, 1)[:8], k[4:12])
    m.forget(["r"])
    assert m.state.owned == {} and len(m.state.free) == m.state.capacity
