"""ZACK weights for the vLLM model class: read the rotations, fold V/O at load (Q/K maps: ``layers.rotate``).

Checkpoint format: ``refengine.kv.methods.zack.format`` (the reference engine's too; README
"ZACK in vLLM"). Per layer, the maps ``R_qk``, ``R_vo`` and the query/output maps ``R_q``,
``R_o`` (the ``whitened`` basis; the shared rotations otherwise), each [kv_heads, d, d] with
column j = j-th right singular vector. With the layer's rank r:

  k' = rope(k) @ R_qk[h][:, :r],  q' = rope(q) @ R_q[h][:, :r] for every query head of KV head h;
  W_v rows of head h (and bias)  ->  R_vo[h][:, :r]^T @ W_v_h            (v' = v @ R_vo)
  W_o columns of query head q    ->  W_o[:, q*d:(q+1)*d] @ R_o[h][:, :r]

Scores keep the original scale d**-0.5. Layers that share a SwiftKV/AcrossKV cache use
the rotations of the group's first layer (the format makes them identical). Torch only.
"""

from __future__ import annotations

from pathlib import Path

import torch

from refengine.kv.methods.zack import format as zack_format


class ZackRotations:
    """Truncated maps per layer, [kv_heads, d, r_layer] float32: ``qk`` (keys), ``q`` (queries), ``vo`` (V), ``o`` (O)."""

    def __init__(self, path: str | Path, ranks: tuple[int, ...]):
        tensors = zack_format.load_rotations(path)
        self.qk, self.vo, self.q, self.o = [], [], [], []
        for i, rank in enumerate(ranks):
            maps = zack_format.layer_maps(tensors, i, path)           # FormatError (a ValueError) if malformed
            for out, t in zip((self.qk, self.vo, self.q, self.o), maps):
                out.append(t[:, :, :rank].float().contiguous())


def fold_v(weight: torch.Tensor, r_vo: torch.Tensor) -> torch.Tensor:
    """W_v [kv_heads*d, ...] (weight or bias) -> [kv_heads*r, ...]: head h becomes R_vo[h]^T @ W_v_h."""
    kvh, d, r = r_vo.shape
    w = weight.float().reshape(kvh, d, -1)
    out = torch.einsum("hdr,hdk->hrk", r_vo, w)
    return out.reshape(kvh * r, *weight.shape[1:]).to(weight.dtype)


def fold_o(weight: torch.Tensor, r_vo: torch.Tensor, num_heads: int) -> torch.Tensor:
    """W_o [hidden, heads*d] -> [hidden, heads*r]: query head q uses R_vo of its KV head."""
    kvh, d, r = r_vo.shape
    per_kv = num_heads // kvh
    w = weight.float().reshape(weight.shape[0], kvh, per_kv, d)
    out = torch.einsum("okgd,kdr->okgr", w, r_vo)
    return out.reshape(weight.shape[0], num_heads * r).to(weight.dtype)


def rotate(x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """x [T, heads*d] (heads grouped per KV head) @ r [kv_heads, d, r] per KV head -> [T, heads*r]."""
    kvh, d, rank = r.shape
    y = torch.einsum("tkgd,kdr->tkgr", x.reshape(x.shape[0], kvh, -1, d), r)
    return y.reshape(x.shape[0], -1)
