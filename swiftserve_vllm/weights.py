"""Checkpoint tensors -> the plugin model's parameters and buffers.

A checkpoint in Llama's names (plus SwiftKV's ``*_swiftkv`` tensors and ZACK's rotations
file) is mapped onto ``model.head`` / ``model.tail`` (``model.py``) for this rank's pipeline
slice; layers of other stages are skipped. The parameters' own ``weight_loader`` cuts this
tensor-parallel rank's share, so tensors arrive whole, except that SwiftKV's K/V of a
model with fewer KV heads than ranks are first repeated per rank (each rank keeps one
replicated head, as ``QKVParallelLinear`` does for the other layers). ZACK: ``R_vo`` is
folded into the V projections and ``o_proj`` before they are cut, and the truncated key
and query maps of this rank's KV heads are copied into the layers' buffers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import torch

from swiftserve_vllm import compat as V
from swiftserve_vllm import zack as Z
from swiftserve_vllm.layout import kv_head_ids


def parameter_for(model, name: str) -> tuple[str, object] | None:
    """Checkpoint name -> (parameter name, shard id or None); None: not used on this rank."""
    m = model.model
    lay, rs = m.layout, m.rs
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    if "rotary_emb.inv_freq" in name or ".zack_" in name:
        return None
    if name == "lm_head.weight":
        return ("lm_head.weight", None) if rs.last and not tied else None
    if name == "model.embed_tokens.weight":
        if rs.first:
            return "model.head.embed_tokens.weight", None
        return ("lm_head.weight", None) if rs.last and tied else None
    if name.startswith("model.norm."):
        if not rs.last:
            return None
        return f"model.{'tail' if rs.tail_layers else 'head'}.norm.{name.split('.')[-1]}", None
    if name.startswith("model.norm_swiftkv."):
        return (f"model.head.norm_swiftkv.{name.split('.')[-1]}", None) if rs.owns_split else None
    parts = name.split(".")
    if len(parts) < 4 or parts[:2] != ["model", "layers"]:
        return name, None
    i, rest, leaf = int(parts[2]), ".".join(parts[3:]), parts[-1]
    if not rs.start <= i < rs.end:
        return None
    later = i in rs.tail_layers
    unit = f"model.{'tail' if later else 'head'}.layers.{i}"
    for proj, shard in (("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v")):
        if rest.startswith(f"self_attn.{proj}."):
            return None if later else (f"{unit}.qkv_proj.{leaf}", shard)
    if rest.startswith("self_attn.q_proj_swiftkv."):
        return (f"{unit}.q_proj.{leaf}", None) if later else None
    for j, proj in enumerate(("k_proj_swiftkv", "v_proj_swiftkv")):
        if rest.startswith(f"self_attn.{proj}."):
            if not later or i != lay.leader_of(i):
                return None
            return f"model.head.kv_proj_swiftkv.{leaf}", 2 * rs.groups.index(lay.group_of(i)) + j
    if rest.startswith("self_attn.k_norm.") and later:        # Qwen3: a group's K uses its leader's k_norm
        if i != lay.leader_of(i):
            return None
        return f"model.head.k_norms.{rs.groups.index(lay.group_of(i))}.{leaf}", None
    for j, proj in enumerate(("gate_proj", "up_proj")):
        if rest.startswith(f"mlp.{proj}."):
            return f"{unit}.mlp.gate_up_proj.{leaf}", j
    return f"{unit}.{rest.removeprefix('self_attn.')}", None      # o_proj, norms, down_proj


def _replicate_kv(t: torch.Tensor, num_kv_heads: int, tp: int) -> torch.Tensor:
    """[kv_heads*w, ...] -> [tp*w, ...]: rank r's slice is KV head r // (tp / kv_heads)."""
    if tp <= num_kv_heads:
        return t
    per = tp // num_kv_heads
    return t.reshape(num_kv_heads, -1, *t.shape[1:]).repeat_interleave(per, dim=0).reshape(-1, *t.shape[1:])


def _fold(model, name: str, tensor: torch.Tensor, rot: Z.ZackRotations) -> torch.Tensor:
    lay = model.model.layout
    lead = lay.leader_of(int(name.split(".")[2]))
    if ".self_attn.v_proj." in name or ".self_attn.v_proj_swiftkv." in name:
        return Z.fold_v(tensor, rot.vo[lead])
    if ".self_attn.o_proj.weight" in name:
        return Z.fold_o(tensor, rot.o[lead], lay.num_heads)
    return tensor


@torch.no_grad()
def _fill_zack_buffers(model, rot: Z.ZackRotations) -> None:
    """Truncated key/query maps of this rank's KV heads into every local layer and SwiftKV group."""
    m = model.model
    lay = m.layout
    heads = kv_head_ids(lay.num_kv_heads, V.get_tensor_model_parallel_world_size(),
                        V.get_tensor_model_parallel_rank())
    units = [m.head] + ([m.tail] if m.tail is not None else [])
    for unit in units:
        for i, layer in unit.layers.items():
            lead = lay.leader_of(int(i))
            layer.zack_qk.copy_(rot.qk[lead][heads])
            layer.zack_q.copy_(rot.q[lead][heads])
    for j, g in enumerate(m.rs.groups):
        getattr(m.head, f"zack_qk_{j}").copy_(rot.qk[lay.group_leader(g)][heads])


def load_checkpoint(model, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
    lay = model.model.layout
    tp = V.get_tensor_model_parallel_world_size()
    rot = None
    if lay.zack:                          # read on the host at load time only; nothing of it is kept
        rot = Z.ZackRotations(Path(model.model.model_dir) / lay.zack_file, lay.zack_ranks)
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    for name, tensor in weights:
        target = parameter_for(model, name)
        if target is None:
            continue
        pname, shard = target
        if pname not in params:
            raise ValueError(f"checkpoint tensor {name} has no parameter {pname} in {type(model).__name__}")
        if rot is not None and ".layers." in name:
            tensor = _fold(model, name, tensor, rot)
        if pname.startswith("model.head.kv_proj_swiftkv."):
            tensor = _replicate_kv(tensor, lay.num_kv_heads, tp)
        param = params[pname]
        loader = getattr(param, "weight_loader", V.default_weight_loader)
        if shard is None:
            loader(param, tensor)
        else:
            loader(param, tensor, shard)
        loaded.add(pname)
    if rot is not None:
        _fill_zack_buffers(model, rot)
    return loaded
