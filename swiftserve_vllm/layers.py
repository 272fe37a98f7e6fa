"""The plugin's decoder pieces: MLP, decoder layer (own K/V or a SwiftKV reader), KV writer.

Shapes are per tensor-parallel rank: a rank holds ``heads / tp`` query heads and the
KV heads ``kv_head_ids(...)`` names (a contiguous share when ``kv_heads % tp == 0``,
one replicated head when ``tp > kv_heads``). Every tensor a layer owns is a parameter
or a buffer, created at construction, so it is built on (and moves with) the model's
device; ZACK's rotations are buffers filled by ``weights.py`` after the checkpoint loads.
"""

from __future__ import annotations

import torch
from torch import nn

from swiftserve_vllm import compat as V
from swiftserve_vllm.layout import ModelLayout, kv_head_ids
from swiftserve_vllm.zack import rotate


def head_norm(norm: nn.Module, x: torch.Tensor, d: int) -> torch.Tensor:
    """RMSNorm over each ``d``-wide head of x [T, heads*d] (Qwen3's q_norm / k_norm)."""
    return norm(x.reshape(-1, d)).reshape(x.shape)


class _MLP(nn.Module):
    def __init__(self, cfg, quant_config, prefix: str):
        super().__init__()
        bias = bool(getattr(cfg, "mlp_bias", False))
        self.gate_up_proj = V.MergedColumnParallelLinear(cfg.hidden_size, [cfg.intermediate_size] * 2, bias=bias,
                                                         quant_config=quant_config, prefix=f"{prefix}.gate_up_proj")
        self.down_proj = V.RowParallelLinear(cfg.intermediate_size, cfg.hidden_size, bias=bias,
                                             quant_config=quant_config, prefix=f"{prefix}.down_proj")
        self.act = V.SiluAndMul()

    def forward(self, x):
        y, _ = self.gate_up_proj(x)
        y, _ = self.down_proj(self.act(y))
        return y


class DecoderLayer(nn.Module):
    """One Llama decoder layer. ``kv_source``: the writer attention whose cache it reads
    (a SwiftKV later layer: only ``q_proj_swiftkv``); None: it projects and writes its own K/V.
    Layer ``i`` is named after the checkpoint's ``model.layers.{i}`` (its attention layer too)."""

    def __init__(self, cfg, layout: ModelLayout, vllm_config, i: int, kv_source: str | None):
        super().__init__()
        tp = V.get_tensor_model_parallel_world_size()
        quant = vllm_config.quant_config
        prefix = f"model.layers.{i}"
        d, r = layout.head_dim, layout.kv_head_size(i)
        self.num_heads = layout.num_heads // tp
        self.num_kv_heads = len(kv_head_ids(layout.num_kv_heads, tp, V.get_tensor_model_parallel_rank()))
        self.q_size, self.k_size, self.v_size = self.num_heads * d, self.num_kv_heads * d, self.num_kv_heads * r
        self.later = kv_source is not None
        qkv_bias, self.d = layout.qkv_bias, d
        p = f"{prefix}.self_attn"
        if self.later:
            self.q_proj = V.ColumnParallelLinear(cfg.hidden_size, layout.num_heads * d, bias=qkv_bias,
                                                 quant_config=quant, prefix=f"{p}.q_proj_swiftkv")
        else:
            self.qkv_proj = V.QKVParallelLinear(cfg.hidden_size, d, layout.num_heads, layout.num_kv_heads,
                                                bias=qkv_bias, quant_config=quant, prefix=f"{p}.qkv_proj",
                                                v_head_size=r)
        self.o_proj = V.RowParallelLinear(layout.num_heads * r, cfg.hidden_size, bias=layout.o_bias,
                                          quant_config=quant, prefix=f"{p}.o_proj")
        if layout.qk_norm:                 # Qwen3 (a reader's K is normed by its group's leader, in the head)
            self.q_norm = V.RMSNorm(d, eps=cfg.rms_norm_eps)
            if not self.later:
                self.k_norm = V.RMSNorm(d, eps=cfg.rms_norm_eps)
        self.rotary_emb = V.get_rope(d, max_position=getattr(cfg, "max_position_embeddings", 8192),
                                     rope_parameters=getattr(cfg, "rope_parameters", None), is_neox_style=True)
        self.attn = V.Attention(self.num_heads, r, d ** -0.5, num_kv_heads=self.num_kv_heads,
                                cache_config=vllm_config.cache_config, quant_config=quant, prefix=f"{p}.attn",
                                per_layer_sliding_window=layout.window(i), kv_sharing_target_layer_name=kv_source)
        self.input_layernorm = V.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = V.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.mlp = _MLP(cfg, quant, f"{prefix}.mlp")
        self.zack = layout.zack
        if self.zack:
            # ZACK key and query maps of this rank's KV heads [kv_heads, d, r] (the group leader's
            # for a SwiftKV reader), filled from the rotations file by the weight loader.
            shape = (self.num_kv_heads, d, r)
            self.register_buffer("zack_qk", torch.zeros(shape), persistent=False)     # model dtype (default)
            self.register_buffer("zack_q", torch.zeros(shape), persistent=False)

    def forward(self, positions: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        x = self.input_layernorm(h)
        if self.later:
            q, _ = self.q_proj(x)
            if hasattr(self, "q_norm"):
                q = head_norm(self.q_norm, q, self.d)
            q, _ = self.rotary_emb(positions, q, None)
            k = v = None
        else:
            qkv, _ = self.qkv_proj(x)
            q, k, v = qkv.split([self.q_size, self.k_size, self.v_size], dim=-1)
            if hasattr(self, "q_norm"):
                q, k = head_norm(self.q_norm, q, self.d), head_norm(self.k_norm, k, self.d)
            q, k = self.rotary_emb(positions, q, k)
            if self.zack:
                k = rotate(k, self.zack_qk)
        if self.zack:
            q = rotate(q, self.zack_q)
        o, _ = self.o_proj(self.attn(q, k, v))
        h = h + o
        return h + self.mlp(self.post_attention_layernorm(h))


class KVWriter(nn.Module):
    """Owns one SwiftKV group's cache (``model.swiftkv_caches.{L + gi}.attn``); attention is never
    run on it: the head writes the group's K/V with ``compat.write_kv``."""

    def __init__(self, layout: ModelLayout, vllm_config, group: int):
        super().__init__()
        tp = V.get_tensor_model_parallel_world_size()
        kvh = len(kv_head_ids(layout.num_kv_heads, tp, V.get_tensor_model_parallel_rank()))
        lead = layout.group_leader(group)
        self.attn = V.Attention(layout.num_heads // tp, layout.kv_head_size(lead), layout.head_dim ** -0.5,
                                num_kv_heads=kvh, cache_config=vllm_config.cache_config,
                                quant_config=vllm_config.quant_config, per_layer_sliding_window=layout.window(lead),
                                prefix=self.name(layout, group))

    @staticmethod
    def name(layout: ModelLayout, group: int) -> str:
        """The cache owner's attention layer name (one past the decoder layers, so that vLLM's
        per-layer-name index stays unique)."""
        return f"model.swiftkv_caches.{layout.num_layers + group}.attn"
