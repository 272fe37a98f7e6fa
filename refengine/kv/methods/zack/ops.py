"""ZACK's tensor work: the QK maps after RoPE and the V/O fold at load time.

Each slot has a key map ``M_k`` (``zack_r_qk``), a query map ``M_q`` (``zack_r_q`` if the
calibration stored one, else ``M_k``: the paper's shared rotation), a value map
``M_v`` (``zack_r_vo``) and an output map ``M_o`` (``zack_r_o``, else ``M_v``); all
``[kv_heads, d, d]`` with columns ranked by singular value, and ``M_q M_k^T = I`` and
``M_v M_o^T = I`` at full rank (orthogonal rotations in the paper's basis).

Shapes (one cache slot; d = head_dim, G = query heads per KV head, ``parts`` and
the flat V / attention-output layouts as defined in ``refengine.kv.spec``):
- ``ZackRotate.keys(k [T, kv_heads, d]) -> [[T, n_p, k_r]]`` per head part
  (``k @ M_k[h][:, :k_r]``), ``queries(q [T, kv_heads*G, d]) -> [[T, n_p*G, k_r]]``
  (``q @ M_q[h][:, :k_r]``).
- ``fold_value_output``: for head h with rank v_r, ``W_v_h' = M_v[h][:, :v_r]^T W_v_h``
  (and its bias), and for each query head q of h, ``W_o_q' = W_o_q M_o[h][:, :v_r]``.
  Then ``v' = v M_v`` is what the cache stores and ``sum_q a_q' W_o_q'^T`` equals the
  original output up to the dropped directions (exactly when v_r = d).
Folds are computed in float64 from the checkpoint's tensors and returned in float32.
"""

from __future__ import annotations

import torch

from refengine.kv.methods.zack.format import tensor_name
from refengine.kv.spec import CacheSpec, GroupSpec, ModelFacts


class ZackRotate:
    """QK transform of one slot: rotate and truncate keys and queries per head part.

    One matmul each for keys and queries, whatever the number of parts: the per-head maps
    are laid out block-diagonally (``k_map [kv_heads*d, sum_p n_p*k_r]``, ``q_map
    [kv_heads*G*d, sum_p n_p*G*k_r]``, parts in order, heads in each part's order), and the
    product is split into the parts' column ranges (views). With adaptive ranks every head
    is its own part; one index_select and one einsum per part and per call cost more than
    the attention they serve saves at decode batch sizes. The zeros add nothing: each
    output column is one head's d products."""

    def __init__(self, group: GroupSpec, m_k: torch.Tensor, m_q: torch.Tensor, device: torch.device,
                 dtype: torch.dtype):
        G, kvh, d = group.q_per_kv, group.kv_heads, m_k.shape[1]
        self.G, self.kvh = G, kvh
        self.k_split = [len(p.heads) * p.k_dim for p in group.parts]
        self.q_split = [len(p.heads) * G * p.k_dim for p in group.parts]
        self.shapes = [(len(p.heads), p.k_dim) for p in group.parts]
        k_map = torch.zeros(kvh * d, sum(self.k_split), dtype=torch.float64)
        q_map = torch.zeros(kvh * G * d, sum(self.q_split), dtype=torch.float64)
        ko = qo = 0
        for p in group.parts:
            r = p.k_dim
            for i, h in enumerate(p.heads):
                k_map[h * d:(h + 1) * d, ko + i * r:ko + (i + 1) * r] = m_k[h, :, :r]
                for g in range(G):
                    q_map[(h * G + g) * d:(h * G + g + 1) * d, qo + (i * G + g) * r:qo + (i * G + g + 1) * r] = \
                        m_q[h, :, :r]
            ko += len(p.heads) * r
            qo += len(p.heads) * G * r
        self.k_map = k_map.to(device=device, dtype=dtype)
        self.q_map = q_map.to(device=device, dtype=dtype)

    def keys(self, k: torch.Tensor) -> list[torch.Tensor]:
        T = k.shape[0]
        flat = k.reshape(T, -1) @ self.k_map
        return [x.view(T, n, r) for x, (n, r) in zip(flat.split(self.k_split, dim=1), self.shapes)]

    def queries(self, q: torch.Tensor) -> list[torch.Tensor]:
        T = q.shape[0]
        flat = q.reshape(T, -1) @ self.q_map
        return [x.view(T, n * self.G, r) for x, (n, r) in zip(flat.split(self.q_split, dim=1), self.shapes)]


def _is_swiftkv_slot(facts: ModelFacts, group: GroupSpec) -> bool:
    return facts.swiftkv_layers is not None and group.layers[0] >= facts.swiftkv_layers


def fold_value_output(facts: ModelFacts, spec: CacheSpec, weights, rotations: dict) -> dict[str, torch.Tensor]:
    """Replaced V-projection and O-projection tensors (by checkpoint name) for every slot."""
    out: dict[str, torch.Tensor] = {}
    d = facts.head_dim
    for group in spec.groups:
        lead = group.layers[0]
        m_v = rotations[tensor_name(lead, "r_vo")].double()                    # [kvh, d, d]
        m_o = rotations.get(tensor_name(lead, "r_o"), m_v).double()
        keep = {h: m_v[h, :, :p.v_dim] for p in group.parts for h in p.heads}  # [d, v_r]
        keep_o = {h: m_o[h, :, :p.v_dim] for p in group.parts for h in p.heads}
        order = [h for p in group.parts for h in p.heads]
        v_proj = "v_proj_swiftkv" if _is_swiftkv_slot(facts, group) else "v_proj"
        base = f"model.layers.{group.layers[0]}.self_attn.{v_proj}"
        w_v = weights.get(base + ".weight", torch.float64)                     # [kvh*d, hidden]
        out[base + ".weight"] = torch.cat([keep[h].T @ w_v[h * d:(h + 1) * d] for h in order]).float()
        if base + ".bias" in weights:
            b_v = weights.get(base + ".bias", torch.float64)
            out[base + ".bias"] = torch.cat([keep[h].T @ b_v[h * d:(h + 1) * d] for h in order]).float()
        G = group.q_per_kv
        for layer in group.layers:
            name = f"model.layers.{layer}.self_attn.o_proj.weight"
            w_o = weights.get(name, torch.float64)                             # [hidden, heads*d]
            cols = [w_o[:, q * d:(q + 1) * d] @ keep_o[h] for h in order for q in range(h * G, (h + 1) * G)]
            out[name] = torch.cat(cols, dim=1).float()
    return out
