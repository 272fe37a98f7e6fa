"""Llama-family decoder (Llama, Mistral, Qwen2) with SwiftKV, over the paged KV cache.

Forward of one engine step (all shapes flattened over the step's tokens):
  input_ids [T], positions [T] -> final-normed hidden states [N, hidden] of the N tokens
  that need logits (``logits_idx``); ``lm_head`` turns them into logits [N, vocab], which the
  runner does in slices when N is large (prompt logprobs), so memory stays bounded.

SwiftKV (``num_key_value_layers = l < L``), as in the papers and Snowflake's checkpoints:
  - layers 0..l-1 run normally on all T tokens;
  - x = norm_swiftkv(h) where h is the residual stream after layer l-1; ONE fused
    GEMM ``x @ W_kv_all^T`` yields K and V for every later cache slot (RoPE on K);
    they are written to the cache for all T tokens;
  - only the N tokens that need logits continue through layers l..L-1, each with
    its ``q_proj_swiftkv`` query, attention against the cache, o_proj and MLP. These
    are the last token of each sampling sequence, plus every prompt position of a
    request that asked for prompt logprobs (``attn_logits`` then has several causal
    query rows for that sequence): that request pays the later layers on its prompt.
  AcrossKV (``key_value_group_size = g``): consecutive later layers share one cache
  slot and one K/V projection (the group's first layer holds the weights).

KV methods reach the model in two places only: weights they replace at load time
(``weights`` may be an ``OverlayWeights``; e.g. ZACK's folded V/O, so the V width
is read from the loaded tensors, not assumed ``kv_heads * head_dim``), and the
cache slot each layer calls (``write(slots, k, v_flat)``, ``attend(q) -> flat``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from refengine.attention import AttnBatch
from refengine.kv.cache import KVCache
from refengine.fused_ops import TORCH_OPS, TorchOps, torch_rms_norm
from refengine.linear import make_linear
from refengine.model_config import ModelSpec
from refengine.rope import Rope
from refengine.weights import OverlayWeights, WeightSource


rms_norm = torch_rms_norm         # transformers' LlamaRMSNorm (distillation imports it from here)


class LlamaLayer(nn.Module):
    """One decoder layer. ``swiftkv_later``: its K/V come from the fused SwiftKV projection."""

    def __init__(self, spec: ModelSpec, idx: int, w: WeightSource | OverlayWeights, dtype, device,
                 swiftkv_later: bool, pack: bool = False, ops: TorchOps = TORCH_OPS):
        super().__init__()
        self.ops = ops
        lin = lambda wt, b=None: make_linear(wt, b, pack)  # noqa: E731
        p = f"model.layers.{idx}."
        get = lambda n: w.get(p + n, dtype, device)  # noqa: E731
        getb = lambda n: w.get(p + n, dtype, device) if (p + n) in w else None  # noqa: E731
        self.spec = spec
        self.swiftkv_later = swiftkv_later
        self.ln1 = nn.Parameter(get("input_layernorm.weight"), requires_grad=False)
        self.ln2 = nn.Parameter(get("post_attention_layernorm.weight"), requires_grad=False)
        if swiftkv_later:
            self.q_proj = lin(get("self_attn.q_proj_swiftkv.weight"), getb("self_attn.q_proj_swiftkv.bias"))
        else:
            names = ("q_proj", "k_proj", "v_proj")
            ws = [get(f"self_attn.{n}.weight") for n in names]
            self.qkv_split = [x.shape[0] for x in ws]          # V may be narrower (KV methods' folds)
            bqkv = torch.cat([get(f"self_attn.{n}.bias") for n in names]) if spec.qkv_bias else None
            self.qkv_proj = lin(torch.cat(ws), bqkv)
        self.o_proj = lin(get("self_attn.o_proj.weight"), getb("self_attn.o_proj.bias"))
        self.gate_up = lin(torch.cat([get("mlp.gate_proj.weight"), get("mlp.up_proj.weight")]),
                               torch.cat([get("mlp.gate_proj.bias"), get("mlp.up_proj.bias")]) if spec.mlp_bias else None)
        self.down = lin(get("mlp.down_proj.weight"), getb("mlp.down_proj.bias"))
        self.scale = spec.head_dim ** -0.5

    def _attn_out_mlp(self, h: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """The residual add of attention output ``a [T, H*dv]``, then the MLP block."""
        h, x = self.ops.add_rms_norm(h, self.o_proj(a), self.ln2, self.spec.rms_norm_eps)
        return h + self.down(self.ops.silu_mul(self.gate_up(x)))

    def forward(self, h, cos, sin, cache, attn: AttnBatch, slots: torch.Tensor):
        """Standard layer on all T tokens: writes this layer's K/V at ``slots``."""
        T = h.shape[0]
        qkv = self.qkv_proj(self.ops.rms_norm(h, self.ln1, self.spec.rms_norm_eps))
        q, k, v = qkv.split(self.qkv_split, dim=-1)
        d = self.spec.head_dim
        q = self.ops.rope(q.view(T, -1, d), cos, sin)
        k = self.ops.rope(k.view(T, -1, d), cos, sin)
        cache.write(slots, k, v)
        a = cache.attend(q, attn, self.scale)
        return self._attn_out_mlp(h, a.reshape(T, -1))

    def forward_swiftkv(self, h, cos, sin, cache, attn: AttnBatch):
        """SwiftKV later layer on the N logits tokens; K/V are already in the cache."""
        N = h.shape[0]
        q = self.q_proj(self.ops.rms_norm(h, self.ln1, self.spec.rms_norm_eps))
        q = self.ops.rope(q.view(N, -1, self.spec.head_dim), cos, sin)
        a = cache.attend(q, attn, self.scale)
        return self._attn_out_mlp(h, a.reshape(N, -1))


class LlamaModel(nn.Module):
    def __init__(self, spec: ModelSpec, model_dir: str, dtype: torch.dtype, device: torch.device,
                 use_swiftkv: bool, max_positions: int, weights: WeightSource | OverlayWeights | None = None,
                 packed_linear: str = "off", ops: TorchOps = TORCH_OPS):
        """``packed_linear``: "off", "lm_head" or "all" (see refengine/linear.py; CPU float32 only).
        ``ops``: the element-wise ops (refengine.fused_ops; torch by default)."""
        super().__init__()
        self.ops = ops
        if packed_linear not in ("off", "lm_head", "all"):
            raise ValueError(f"packed_linear {packed_linear!r} not in ('off', 'lm_head', 'all')")
        pack_layers = packed_linear == "all"
        w = weights if weights is not None else WeightSource(model_dir)
        self.spec = spec
        self.use_swiftkv = bool(use_swiftkv and spec.swiftkv)
        L = spec.num_layers
        self.num_kv_layers = spec.num_key_value_layers if self.use_swiftkv else L
        self.group_size = spec.key_value_group_size if self.use_swiftkv else 1
        self.embed = nn.Parameter(w.get("model.embed_tokens.weight", dtype, device), requires_grad=False)
        self.layers = nn.ModuleList(
            LlamaLayer(spec, i, w, dtype, device, swiftkv_later=i >= self.num_kv_layers, pack=pack_layers, ops=ops)
            for i in range(L))
        self.norm = nn.Parameter(w.get("model.norm.weight", dtype, device), requires_grad=False)
        if spec.tie_word_embeddings or "lm_head.weight" not in w:
            head = self.embed.data              # tied: a packed head is a second copy of these rows
        else:
            head = w.get("lm_head.weight", dtype, device)
        self.lm_head = make_linear(head, None, packed_linear != "off")
        self.rope = Rope(spec.head_dim, spec.rope_theta, spec.rope_scaling, max_positions, dtype, device)
        if self.use_swiftkv:
            self._load_swiftkv(w, dtype, device, pack_layers)
        w.close()

    def _load_swiftkv(self, w: WeightSource, dtype, device, pack: bool) -> None:
        l, L, g = self.num_kv_layers, self.spec.num_layers, self.group_size
        self.norm_swiftkv = nn.Parameter(w.get("model.norm_swiftkv.weight", dtype, device), requires_grad=False)
        # Fused projection rows: for each group, [K (kv_heads*head_dim) ; V (its slot's V width)].
        ws, bs = [], []
        self.group_leaders = list(range(l, L, g))
        for i in self.group_leaders:
            p = f"model.layers.{i}.self_attn."
            for n in ("k_proj_swiftkv", "v_proj_swiftkv"):
                ws.append(w.get(p + n + ".weight", dtype, device))
                if self.spec.qkv_bias:
                    bs.append(w.get(p + n + ".bias", dtype, device))
        self.kv_split = [x.shape[0] for x in ws]              # [K_0, V_0, K_1, V_1, ...]
        self.kv_proj_swiftkv = make_linear(torch.cat(ws), torch.cat(bs) if bs else None, pack)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv: KVCache,
                attn_all: AttnBatch, slots: torch.Tensor, logits_idx: torch.Tensor,
                attn_logits: AttnBatch | None = None) -> torch.Tensor:
        h = F.embedding(input_ids, self.embed)
        cos, sin = self.rope.tables(positions)
        for i in range(self.num_kv_layers):
            h = self.layers[i](h, cos, sin, kv.layers[i], attn_all, slots)
        if self.use_swiftkv:
            h = self._swiftkv_tail(h, positions, cos, sin, kv, slots, logits_idx, attn_logits)
        else:
            h = h[logits_idx]
        return self.ops.rms_norm(h, self.norm, self.spec.rms_norm_eps)

    def _swiftkv_tail(self, h, positions, cos, sin, kv: KVCache, slots, logits_idx, attn_logits):
        T, d = h.shape[0], self.spec.head_dim
        kvh = self.spec.num_kv_heads
        x = self.ops.rms_norm(h, self.norm_swiftkv, self.spec.rms_norm_eps)
        fused = self.kv_proj_swiftkv(x).split(self.kv_split, dim=-1)    # one GEMM
        for gi, leader in enumerate(self.group_leaders):
            k = self.ops.rope(fused[2 * gi].view(T, kvh, d), cos, sin)
            kv.layers[leader].write(slots, k, fused[2 * gi + 1])
        if logits_idx.numel() == 0:
            return h[:0]
        h = h[logits_idx]
        cos_l, sin_l = cos[logits_idx], sin[logits_idx]
        for i in range(self.num_kv_layers, self.spec.num_layers):
            h = self.layers[i].forward_swiftkv(h, cos_l, sin_l, kv.layers[i], attn_logits)
        return h
