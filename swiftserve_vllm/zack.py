"""ZACK weights for the vLLM model class: read the rotations, fold V/O at load (Q/K maps: ``layers.rotate``).

Checkpoint format (version 1, see README "ZACK in vLLM"): ``zack.safetensors`` holds for
every layer ``i`` float32 ``model.layers.{i}.self_attn.zack_r_qk`` / ``zack_r_vo`` of
shape [kv_heads, d, d] (column j = j-th right singular vector), and optionally
``zack_r_q`` / ``zack_r_o`` (the separate query and output maps of the ``whitened``
basis; absent, the paper's shared rotations ``R_qk`` / ``R_vo`` are used). With the
uniform rank r:

  k' = rope(k) @ R_qk[h][:, :r],  q' = rope(q) @ R_q[h][:, :r] for every query head of KV head h;
  W_v rows of head h (and bias)  ->  R_vo[h][:, :r]^T @ W_v_h            (v' = v @ R_vo)
  W_o columns of query head q    ->  W_o[:, q*d:(q+1)*d] @ R_o[h][:, :r]

Scores keep the original scale d**-0.5. Layers that share a SwiftKV/AcrossKV cache use
the rotations of the group's first layer (the format makes them identical). Torch only.
"""

from __future__ import annotations

from pathlib import Path

import torch


class ZackRotations:
    """Truncated maps per layer, [kv_heads, d, r_layer] float32: ``qk`` (keys), ``q`` (queries), ``vo`` (V), ``o`` (O)."""

    def __init__(self, path: str | Path, ranks: tuple[int, ...]):
        from safetensors.torch import load_file

        tensors = load_file(str(path))
        self.qk, self.vo, self.q, self.o = [], [], [], []
        for i, rank in enumerate(ranks):
            p = f"model.layers.{i}.self_attn."
            try:
                qk, vo = tensors[p + "zack_r_qk"], tensors[p + "zack_r_vo"]
            except KeyError as exc:
                raise ValueError(f"{path}: missing ZACK rotation {exc.args[0]}") from None
            if qk.dim() != 3 or qk.shape[1] != qk.shape[2] or vo.shape != qk.shape:
                raise ValueError(f"{path}: layer {i} rotations must be [kv_heads, d, d], got {tuple(qk.shape)}")
            q, o = tensors.get(p + "zack_r_q", qk), tensors.get(p + "zack_r_o", vo)
            if q.shape != qk.shape or o.shape != qk.shape:
                raise ValueError(f"{path}: layer {i} query/output maps must match the rotations' shape")
            for out, t in ((self.qk, qk), (self.vo, vo), (self.q, q), (self.o, o)):
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
