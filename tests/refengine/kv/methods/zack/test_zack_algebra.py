"""ZACK's algebra through the engine's own cache code (CPU, float64 where exactness is checked).

- Nothing dropped (full rank): attention on rotated (or any A, B with A B^T = I) queries
  and keys, with V folded, equals attention on the originals.
- Ragged per-head ranks: the cache's compressed attention equals dense attention on the
  vectors projected onto the kept directions, heads of different sizes stored apart.
- Folding V into W_v and W_o gives the layer output an unfolded computation gives.
"""

import torch

from refengine.attention import build_attn_batch, slot_mapping
from refengine.kv.cache import KVCache
from refengine.kv.methods.zack.format import tensor_name
from refengine.kv.spec import CacheSpec, ModelFacts
from refengine.kv.methods.zack.ops import ZackRotate, fold_value_output

CPU = torch.device("cpu")
D, KVH, G, T = 16, 3, 2, 13
DT = torch.float64


def orthogonal(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.linalg.qr(torch.randn(KVH, n, n, generator=g, dtype=DT))[0]


def reference(q, k, v, scale):
    """Causal attention, GQA by repetition: q [T, H, d], k/v [T, KVH, d] -> [T, H, dv]."""
    kk, vv = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    s = torch.einsum("qhd,khd->hqk", q, kk) * scale
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("hqk,khd->qhd", s.softmax(-1), vv)


def slot_with(k_dims, v_dims, m_k, m_q):
    facts = ModelFacts("/m", 1, KVH * G, KVH, D, 8, None, 1)
    group = CacheSpec.for_model(facts).groups[0].with_(k_dims=tuple(k_dims), v_dims=tuple(v_dims))
    kv = KVCache(CacheSpec((group,), (0,)), [], num_blocks=8, block_size=4, dtype=DT, device=CPU)
    slot = kv.slots[0]
    slot.transform = ZackRotate(group, m_k, m_q, CPU, DT)
    return group, slot


def run(slot, q, k, v_flat):
    table = [3, 0, 6, 1]
    slot.write(slot_mapping([(0, T, table)], 4, CPU), k, v_flat)
    # a chunk continuing a prefix (rows 5..12) and a single-token row (position 4), as in serving
    batch = build_attn_batch([(5, T - 5, table), (4, 1, table)], 4, CPU)
    out = slot.attend(torch.cat([q[5:], q[4:5]]), batch, D ** -0.5)
    return torch.cat([out[-1:], out[:-1]])                         # rows for positions 4..12


def compress_v(group, v, m_v):
    """v [T, KVH, d] -> the flat V layout of the spec: parts in order, each head v_dim wide."""
    return torch.cat([v[:, h] @ m_v[h, :, :p.v_dim] for p in group.parts for h in p.heads], dim=-1)


def decompress_out(group, out_flat, m_o):
    """Flat attention output [T', out_width] -> per query head in model order [T', H, d]."""
    res = torch.empty(out_flat.shape[0], KVH * G, D, dtype=DT)
    col = 0
    for p in group.parts:
        for h in p.heads:
            for j in range(G):
                res[:, h * G + j] = out_flat[:, col:col + p.v_dim] @ m_o[h, :, :p.v_dim].T
                col += p.v_dim
    return res


def test_nothing_dropped_equals_full_attention():
    torch.manual_seed(0)
    q, k, v = torch.randn(T, KVH * G, D, dtype=DT), torch.randn(T, KVH, D, dtype=DT), torch.randn(T, KVH, D, dtype=DT)
    ref = reference(q, k, v, D ** -0.5)[4:]
    for m_k, m_q, m_v, m_o in [
        (orthogonal(D, 1), None, orthogonal(D, 2), None),                       # the paper's rotations
        (torch.randn(KVH, D, D, dtype=DT), "inv", torch.randn(KVH, D, D, dtype=DT), "inv"),   # any A B^T = I
    ]:
        m_q = m_k if m_q is None else torch.linalg.inv(m_k).transpose(-1, -2)
        m_o = m_v if m_o is None else torch.linalg.inv(m_v).transpose(-1, -2)
        group, slot = slot_with([D] * KVH, [D] * KVH, m_k, m_q)
        out = run(slot, q, k, compress_v(group, v, m_v))
        assert torch.allclose(decompress_out(group, out, m_o), ref, atol=1e-9)


def test_ragged_ranks_equal_attention_on_projected_vectors():
    torch.manual_seed(1)
    q, k, v = torch.randn(T, KVH * G, D, dtype=DT), torch.randn(T, KVH, D, dtype=DT), torch.randn(T, KVH, D, dtype=DT)
    m_qk, m_vo = orthogonal(D, 3), orthogonal(D, 4)
    k_dims, v_dims = (5, 12, 5), (7, 16, 3)
    group, slot = slot_with(k_dims, v_dims, m_qk, m_qk)
    assert len(group.parts) == 3 and slot.device_bytes_per_token == (sum(k_dims) + sum(v_dims)) * 8
    out = run(slot, q, k, compress_v(group, v, m_vo))
    # dense reference on projections onto the kept directions (P = M_r M_r^T)
    proj = lambda m, r: m[:, :r] @ m[:, :r].T  # noqa: E731
    kp = torch.stack([k[:, h] @ proj(m_qk[h], k_dims[h]) for h in range(KVH)], 1)
    qp = torch.stack([q[:, h] @ proj(m_qk[h // G], k_dims[h // G]) for h in range(KVH * G)], 1)
    vp = torch.stack([v[:, h] @ proj(m_vo[h], v_dims[h]) for h in range(KVH)], 1)
    ref = reference(qp, kp, vp, D ** -0.5)[4:]
    assert torch.allclose(decompress_out(group, out, m_vo), ref, atol=1e-9)


class Weights(dict):
    def get(self, name, dtype=None, device="cpu"):
        return self[name].to(dtype)


def test_fold_preserves_the_layer_output():
    torch.manual_seed(2)
    hidden, H = 24, KVH * G
    facts = ModelFacts("/m", 1, H, KVH, D, 4, None, 1)
    w = Weights({"model.layers.0.self_attn.v_proj.weight": torch.randn(KVH * D, hidden, dtype=DT),
                 "model.layers.0.self_attn.v_proj.bias": torch.randn(KVH * D, dtype=DT),
                 "model.layers.0.self_attn.o_proj.weight": torch.randn(hidden, H * D, dtype=DT)})
    x, probs = torch.randn(T, hidden, dtype=DT), torch.rand(H, T, T, dtype=DT).softmax(-1)

    def layer_out(w_v, b_v, w_o, group):
        v = x @ w_v.T + b_v                                     # [T, v_width] in the spec's layout
        widths = [p.v_dim for p in group.parts for _ in p.heads]
        heads = [h for p in group.parts for h in p.heads]
        vs = dict(zip(heads, v.split(widths, dim=-1)))
        a = torch.cat([probs[qh] @ vs[h] for h in heads for qh in range(h * G, (h + 1) * G)], dim=-1)
        return a @ w_o.T

    plain = CacheSpec.for_model(facts)
    names = ("model.layers.0.self_attn.v_proj.weight", "model.layers.0.self_attn.v_proj.bias",
             "model.layers.0.self_attn.o_proj.weight")
    ref = layer_out(*(w[n] for n in names), plain.groups[0])
    for m_v, m_o in [(orthogonal(D, 5), None), (torch.randn(KVH, D, D, dtype=DT), "inv")]:
        rot = {tensor_name(0, "r_vo"): m_v}
        if m_o is not None:
            rot[tensor_name(0, "r_o")] = torch.linalg.inv(m_v).transpose(-1, -2)
        folded = fold_value_output(facts, plain, w, rot)
        got = layer_out(*(folded[n].double() for n in names), plain.groups[0])
        assert torch.allclose(got, ref, rtol=1e-5, atol=1e-4)      # folds are returned in float32
    # truncated, ragged: equals the output with V projected onto the kept directions
    m_v = orthogonal(D, 6)
    spec = plain.replace_groups([plain.groups[0].with_(v_dims=(4, 9, 4))])
    folded = fold_value_output(facts, spec, w, {tensor_name(0, "r_vo"): m_v})
    got = layer_out(*(folded[n].double() for n in names), spec.groups[0])
    w_v = w[names[0]].clone()
    b_v = w[names[1]].clone()
    for h, r in enumerate((4, 9, 4)):
        p = m_v[h, :, :r] @ m_v[h, :, :r].T
        w_v[h * D:(h + 1) * D] = p @ w_v[h * D:(h + 1) * D]
        b_v[h * D:(h + 1) * D] = p @ b_v[h * D:(h + 1) * D]
    want = layer_out(w_v, b_v, w[names[2]], plain.groups[0])
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-4)
