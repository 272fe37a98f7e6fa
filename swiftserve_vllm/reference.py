"""Verification helpers for the vLLM plugin (torch only, no vLLM): a test ZACK checkpoint
with random orthogonal rotations, and a small pure-torch reference of ZACK's semantics.

``make_random_zack(base, out, rank)``: ``out`` = ``base``'s files (hard or symbolic links)
+ config.json's ``"zack"`` object (uniform rank) + ``zack.safetensors`` with random
orthogonal ``R_qk``/``R_vo`` per layer and KV head (layers sharing a SwiftKV/AcrossKV
cache get the group leader's). With ``rank == head_dim`` attention is unchanged (dot
products and V->O are rotation-invariant), so greedy tokens must equal the base model's.

``zack_greedy(model_dir, prompt, n)``: greedy tokens of a Llama (no SwiftKV) by full
recomputation, written from the semantics, not from the plugin's code: q, k rotated and
truncated after RoPE, scores scaled by d**-0.5, v' = v @ R_vo[:, :r], and the attention
output mapped back with R_vo^T before the ORIGINAL o_proj (equal to folding W_o).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F

from refengine.kv.methods.zack import format as zack_format
from swiftserve_vllm.layout import parse_layout


def _link(src: Path, dst: Path) -> None:
    """Hard link (same filesystem), else a symbolic link: the weights are never copied."""
    try:
        os.link(src, dst)
    except OSError:
        os.symlink(src.resolve(), dst)


def make_random_zack(base: str | Path, out: str | Path, rank: int | list[int], seed: int = 0,
                     kind: str = "random") -> Path:
    """``rank``: one for every layer, or one per layer (layer-wise). ``kind``: "random" orthogonal
    rotations, or "weights": per KV head the left singular vectors of that head's W_k / W_v
    (descending singular value; data-free, so truncation keeps the model coherent enough for
    greedy parity to be meaningful at rank < head_dim)."""
    base, out = Path(base), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((base / "config.json").read_text())
    lay = parse_layout(cfg)
    for f in base.iterdir():
        if f.is_file() and f.name not in ("config.json", zack_format.ROTATIONS_FILE) and not (out / f.name).exists():
            _link(f, out / f.name)
    gen = torch.Generator().manual_seed(seed)
    W = _weights(base) if kind == "weights" else None
    tensors: dict[str, torch.Tensor] = {}
    rot: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for i in range(lay.num_layers):
        leader = lay.leader_of(i)
        if leader not in rot:
            mats = []
            for proj in ("k", "v"):
                if W is not None:
                    later = lay.swiftkv and leader >= lay.num_kv_layers
                    name = f"model.layers.{leader}.self_attn.{proj}_proj{'_swiftkv' if later else ''}.weight"
                    w = W[name].double().view(lay.num_kv_heads, lay.head_dim, -1)
                    q = torch.linalg.svd(w, full_matrices=False)[0]          # [kv_heads, d, d]
                else:
                    a = torch.randn(lay.num_kv_heads, lay.head_dim, lay.head_dim, generator=gen, dtype=torch.float64)
                    q, _ = torch.linalg.qr(a)
                mats.append(q.float().contiguous())
            rot[leader] = (mats[0], mats[1])
        qk, vo = rot[leader]
        name = zack_format.tensor_name
        tensors[name(i, "r_qk")], tensors[name(i, "r_vo")] = qk.clone(), vo.clone()
        tensors[name(i, "s_qk")] = torch.ones(lay.num_kv_heads, lay.head_dim)
        tensors[name(i, "s_vo")] = torch.ones(lay.num_kv_heads, lay.head_dim)
    from safetensors.torch import save_file

    save_file(tensors, str(out / zack_format.ROTATIONS_FILE))
    per_layer = [rank] * lay.num_layers if isinstance(rank, int) else list(rank)
    ranks = [[r] * lay.num_kv_heads for r in per_layer]
    # rotations only (no zack.json): the object names no calibration
    cfg["zack"] = zack_format.served_config("uniform" if len(set(per_layer)) == 1 else "layerwise",
                                            1.0 - sum(per_layer) / (lay.head_dim * lay.num_layers), None,
                                            ranks, [list(r) for r in ranks], calibration=None)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


def _weights(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        if f.name != zack_format.ROTATIONS_FILE:
            out.update({k: v.float() for k, v in load_file(str(f)).items()})
    return out


def _rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x, pos, theta):            # x [T, heads, d], neox (rotate-half) style
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    ang = pos[:, None].double() * inv[None, :]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1).float(), torch.cat([ang.sin(), ang.sin()], -1).float()
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos[:, None, :] + torch.cat([-x2, x1], -1) * sin[:, None, :]


@torch.no_grad()
def zack_greedy(model_dir: str | Path, prompt: list[int], max_tokens: int) -> list[int]:
    model_dir = Path(model_dir)
    cfg = json.loads((model_dir / "config.json").read_text())
    lay = parse_layout(cfg, use_swiftkv=False)
    W = _weights(model_dir)
    rot = None
    if lay.zack:
        rot = zack_format.load_rotations(model_dir / lay.zack_file)
    theta = float((cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta", 10000.0)))
    eps = float(cfg.get("rms_norm_eps", 1e-6))
    H, K, d = lay.num_heads, lay.num_kv_heads, lay.head_dim
    lm_head = W.get("lm_head.weight", W["model.embed_tokens.weight"])
    ids = list(prompt)
    for _ in range(max_tokens):
        T = len(ids)
        pos = torch.arange(T)
        h = W["model.embed_tokens.weight"][torch.tensor(ids)]
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        for i in range(lay.num_layers):
            p = f"model.layers.{i}."
            x = _rms(h, W[p + "input_layernorm.weight"], eps)
            q = _rope((x @ W[p + "self_attn.q_proj.weight"].T).view(T, H, d), pos, theta)
            k = _rope((x @ W[p + "self_attn.k_proj.weight"].T).view(T, K, d), pos, theta)
            v = (x @ W[p + "self_attn.v_proj.weight"].T).view(T, K, d)
            q = q.view(T, K, H // K, d)
            if rot is not None:
                r = lay.zack_ranks[i]
                rqk = rot[zack_format.tensor_name(i, "r_qk")][:, :, :r]
                rvo = rot[zack_format.tensor_name(i, "r_vo")][:, :, :r]
                q = torch.einsum("tkgd,kdr->tkgr", q, rqk)
                k = torch.einsum("tkd,kdr->tkr", k, rqk)
                v = torch.einsum("tkd,kdr->tkr", v, rvo)
            s = torch.einsum("tkgr,ukr->kgtu", q, k) * d ** -0.5
            a = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1)
            o = torch.einsum("kgtu,ukr->tkgr", a, v)
            if rot is not None:
                o = torch.einsum("tkgr,kdr->tkgd", o, rvo)          # back to d dims: W_o @ R_vo folded
            h = h + o.reshape(T, H * d) @ W[p + "self_attn.o_proj.weight"].T
            x = _rms(h, W[p + "post_attention_layernorm.weight"], eps)
            g, u = x @ W[p + "mlp.gate_proj.weight"].T, x @ W[p + "mlp.up_proj.weight"].T
            h = h + (F.silu(g) * u) @ W[p + "mlp.down_proj.weight"].T
        logits = _rms(h[-1], W["model.norm.weight"], eps) @ lm_head.T
        ids.append(int(logits.argmax()))
    return ids[len(prompt):]

