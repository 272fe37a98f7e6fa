"""The decoder of every served family (Llama, Mistral, Qwen2, Qwen3, Gemma 3) with SwiftKV, over the paged KV cache.

A family only switches parts on (``ModelSpec`` fields, read by ``refengine.model_families``):
QK-norm (an RMSNorm over each head of q and k before RoPE), ``(1 + w)`` norms (folded into
the weights at load time, in float32), embedding scaling, sandwich norms (a norm on the
attention and MLP outputs before each residual add, and a pre-MLP norm), GeGLU, the softmax
scale, a final logit soft cap, and per-layer sliding windows with their own RoPE base.

Forward of one engine step (all shapes flattened over the step's tokens):
  input_ids [T], positions [T] -> final-normed hidden states [N, hidden] of the N tokens
  that need logits (``logits_idx``); ``logits`` turns them into logits [N, vocab] (lm_head and
  the family's soft cap), which the runner does in slices when N is large (prompt logprobs),
  so memory stays bounded.
``attn_all`` / ``slots`` (and ``attn_logits``) are lists indexed by *table group*: layers
whose cache blocks are kept in one block table (the global layers; each sliding window's
layers; ``KVCache.layer_group[i]`` says which). A windowed group's ``AttnBatch`` carries its
window, so a layer never needs to know it has one.

SwiftKV (``num_key_value_layers = l < L``), as in the papers and Snowflake's checkpoints:
  - layers 0..l-1 run normally on all T tokens;
  - x = norm_swiftkv(h) where h is the residual stream after layer l-1; ONE fused
    GEMM ``x @ W_kv_all^T`` yields K and V for every later cache slot (the group
    leader's k_norm, then its RoPE, on K); they are written to the cache for all T tokens;
  - only the N tokens that need logits continue through layers l..L-1, each with
    its ``q_proj_swiftkv`` query (and its own q_norm), attention against the cache, o_proj
    and MLP. These are the last token of each sampling sequence, plus every prompt position
    of a request that asked for prompt logprobs (``attn_logits`` then has several causal
    query rows for that sequence): that request pays the later layers on its prompt.
  AcrossKV (``key_value_group_size = g``): consecutive later layers share one cache
  slot and one K/V projection (the group's first layer holds the weights).
  A later layer keeps its window and RoPE base: SwiftKV changes where its K/V come from,
  not what it attends to (``model_config`` refuses AcrossKV groups that mix layer types).

KV methods reach the model in two places only: weights they replace at load time
(``weights`` may be an ``OverlayWeights``; e.g. ZACK's folded V/O, so the V width
is read from the loaded tensors, not assumed ``kv_heads * head_dim``), and the
cache slot each layer calls (``write(slots, k, v_flat)``, ``attend(q) -> flat``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from refengine.decode_stack import stack_for
from refengine.fused_ops import TORCH_OPS, TorchOps, torch_rms_norm
from refengine.kv.cache import KVCache
from refengine.linear import make_linear
from refengine.model_config import ModelSpec
from refengine.quant.plan import QuantPlan, load_linear_weight, quant_embedding
from refengine.rope import Rope
from refengine.weights import OverlayWeights, WeightSource


rms_norm = torch_rms_norm         # transformers' LlamaRMSNorm (distillation imports it from here)


def norm_weight(w, name: str, spec: ModelSpec, dtype, device) -> nn.Parameter:
    """An RMSNorm weight with the family's offset folded in (``offset + w`` computed in float32)."""
    t = w.get(name, torch.float32, device)
    if spec.norm_offset:
        t = t + spec.norm_offset
    return nn.Parameter(t.to(dtype), requires_grad=False)


class LlamaLayer(nn.Module):
    """One decoder layer. ``swiftkv_later``: its K/V come from the fused SwiftKV projection."""

    def __init__(self, spec: ModelSpec, idx: int, w: WeightSource | OverlayWeights, dtype, device,
                 swiftkv_later: bool, pack: bool = False, ops: TorchOps = TORCH_OPS, quant: QuantPlan | None = None):
        super().__init__()
        self.ops = ops
        lin = lambda wt, b=None: make_linear(wt, b, pack, quant)  # noqa: E731
        p = f"model.layers.{idx}."
        get = lambda n: load_linear_weight(w, p + n, dtype, device, quant)  # noqa: E731 (dense or QTensor)
        getb = lambda n: w.get(p + n, dtype, device) if (p + n) in w else None  # noqa: E731
        norm = lambda n: norm_weight(w, p + n, spec, dtype, device)  # noqa: E731
        self.spec = spec
        self.swiftkv_later = swiftkv_later
        self.ln1 = norm("input_layernorm.weight")
        self.ln2 = norm("post_attention_layernorm.weight")
        if spec.sandwich_norm:
            self.ln_pre_ff = norm("pre_feedforward_layernorm.weight")
            self.ln_post_ff = norm("post_feedforward_layernorm.weight")
        if spec.qk_norm:
            self.q_norm = norm("self_attn.q_norm.weight")
            self.k_norm = norm("self_attn.k_norm.weight")
        if swiftkv_later:
            self.q_proj = lin(get("self_attn.q_proj_swiftkv.weight"), getb("self_attn.q_proj_swiftkv.bias"))
        else:
            names = ("q_proj", "k_proj", "v_proj")
            ws = [get(f"self_attn.{n}.weight") for n in names]
            self.qkv_split = [x.shape[0] for x in ws]          # V may be narrower (KV methods' folds)
            bqkv = torch.cat([get(f"self_attn.{n}.bias") for n in names]) if spec.qkv_bias else None
            self.qkv_proj = lin(ws, bqkv)
        self.o_proj = lin(get("self_attn.o_proj.weight"), getb("self_attn.o_proj.bias"))
        self.gate_up = lin([get("mlp.gate_proj.weight"), get("mlp.up_proj.weight")],
                               torch.cat([get("mlp.gate_proj.bias"), get("mlp.up_proj.bias")]) if spec.mlp_bias else None)
        self.down = lin(get("mlp.down_proj.weight"), getb("mlp.down_proj.bias"))
        self.act = ops.silu_mul if spec.hidden_act == "silu" else ops.gelu_mul
        self.scale = spec.attn_scale or spec.head_dim ** -0.5

    def head_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """QK-norm: RMSNorm over the last dim of ``x [T, n, d]``."""
        T, n, d = x.shape
        return self.ops.rms_norm(x.reshape(T * n, d), weight, self.spec.rms_norm_eps).view(T, n, d)

    def query(self, q: torch.Tensor, cos, sin) -> torch.Tensor:
        """``q [T, H*d]`` -> heads after QK-norm (if any) and RoPE."""
        q = q.reshape(q.shape[0], -1, self.spec.head_dim)
        if self.spec.qk_norm:
            q = self.head_norm(q, self.q_norm)
        return self.ops.rope(q, cos, sin)

    def key(self, k: torch.Tensor, cos, sin) -> torch.Tensor:
        k = k.reshape(k.shape[0], -1, self.spec.head_dim)
        if self.spec.qk_norm:
            k = self.head_norm(k, self.k_norm)
        return self.ops.rope(k, cos, sin)

    def _attn_out_mlp(self, h: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """The residual add of attention output ``a [T, H*dv]``, then the MLP block."""
        eps, ops = self.spec.rms_norm_eps, self.ops
        if self.spec.sandwich_norm:                # Gemma: norm each branch's output before its residual add
            h, x = ops.add_rms_norm(h, ops.rms_norm(self.o_proj(a), self.ln2, eps), self.ln_pre_ff, eps)
            return h + ops.rms_norm(self.down(self.act(self.gate_up(x))), self.ln_post_ff, eps)
        h, x = ops.add_rms_norm(h, self.o_proj(a), self.ln2, eps)
        return h + self.down(self.act(self.gate_up(x)))

    def forward(self, h, cos, sin, cache, attn, slots: torch.Tensor):
        """Standard layer on all T tokens: writes this layer's K/V at ``slots``."""
        T = h.shape[0]
        qkv = self.qkv_proj(self.ops.rms_norm(h, self.ln1, self.spec.rms_norm_eps))
        if self.spec.qk_norm:
            q, k, v = qkv.split(self.qkv_split, dim=-1)
            k, q = self.key(k, cos, sin), self.query(q, cos, sin)
        else:
            # Q's and K's heads are adjacent in qkv: one RoPE call over [T, Hq + Hk, d] (a view) instead of two.
            nq, nk, d = self.qkv_split[0], self.qkv_split[1], self.spec.head_dim
            qk = self.ops.rope(qkv[:, :nq + nk].view(T, -1, d), cos, sin)
            q, k, v = qk[:, :nq // d], qk[:, nq // d:], qkv[:, nq + nk:]
        cache.write(slots, k, v)
        a = cache.attend(q, attn, self.scale)
        return self._attn_out_mlp(h, a.reshape(T, -1))

    def forward_swiftkv(self, h, cos, sin, cache, attn):
        """SwiftKV later layer on the N logits tokens; K/V are already in the cache."""
        N = h.shape[0]
        q = self.query(self.q_proj(self.ops.rms_norm(h, self.ln1, self.spec.rms_norm_eps)), cos, sin)
        a = cache.attend(q, attn, self.scale)
        return self._attn_out_mlp(h, a.reshape(N, -1))


class LlamaModel(nn.Module):
    def __init__(self, spec: ModelSpec, model_dir: str, dtype: torch.dtype, device: torch.device,
                 use_swiftkv: bool, max_positions: int, weights: WeightSource | OverlayWeights | None = None,
                 packed_linear: str = "off", ops: TorchOps = TORCH_OPS, quant: QuantPlan | None = None):
        """``packed_linear``: "off", "lm_head" or "all" (see refengine/linear.py; CPU float32 and bfloat16).
        ``ops``: the element-wise ops (refengine.fused_ops; torch by default). ``quant``: set when the
        weights are quantized (refengine.quant: a GGUF file, a W8A8 checkpoint): linear weights (and a
        GGUF embedding) stay quantized."""
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
        self.quant = quant
        if quant is None:
            self.embed = nn.Parameter(w.get("model.embed_tokens.weight", dtype, device), requires_grad=False)
        else:                  # a GGUFEmbedding (its blocks) or, without kernels, the dequantized table
            table = quant_embedding(load_linear_weight(w, "model.embed_tokens.weight", dtype, device, quant), quant)
            self.embed = table if isinstance(table, nn.Module) else nn.Parameter(table, requires_grad=False)
        # transformers multiplies by the scale cast to the weights' dtype (Gemma: sqrt(hidden)).
        self.embed_scale = None if spec.embed_scale == 1.0 else torch.tensor(spec.embed_scale, dtype=dtype)
        self.layers = nn.ModuleList(
            LlamaLayer(spec, i, w, dtype, device, swiftkv_later=i >= self.num_kv_layers, pack=pack_layers, ops=ops,
                       quant=quant)
            for i in range(L))
        self.norm = norm_weight(w, "model.norm.weight", spec, dtype, device)
        if spec.tie_word_embeddings or "lm_head.weight" not in w:
            # tied: a packed head is a second copy of these rows; a quantized one shares the blocks
            head = self.embed.weight if isinstance(self.embed, nn.Module) else self.embed.data
        else:
            head = load_linear_weight(w, "lm_head.weight", dtype, device, quant)
        self.lm_head = make_linear(head, None, packed_linear != "off", quant)
        # RoPE tables: index 0 global, 1 the windowed layers' own base (Gemma 3); layer_rope[i] picks.
        self.ropes = [Rope(spec.head_dim, spec.rope_theta, spec.rope_scaling, max_positions, dtype, device)]
        self.layer_rope = [0] * L
        if spec.local_rope_theta is not None and spec.layer_windows:
            self.ropes.append(Rope(spec.head_dim, spec.local_rope_theta, None, max_positions, dtype, device))
            self.layer_rope = [0 if spec.window(i) is None else 1 for i in range(L)]
        if self.use_swiftkv:
            self._load_swiftkv(w, dtype, device, pack_layers)
        w.close()
        self._stack_kv = self._stack = None        # refengine.decode_stack's path, per cache

    def _load_swiftkv(self, w: WeightSource, dtype, device, pack: bool) -> None:
        l, L, g = self.num_kv_layers, self.spec.num_layers, self.group_size
        self.norm_swiftkv = norm_weight(w, "model.norm_swiftkv.weight", self.spec, dtype, device)
        # Fused projection rows: for each group, [K (kv_heads*head_dim) ; V (its slot's V width)].
        ws, bs = [], []
        self.group_leaders = list(range(l, L, g))
        for i in self.group_leaders:
            p = f"model.layers.{i}.self_attn."
            for n in ("k_proj_swiftkv", "v_proj_swiftkv"):
                ws.append(load_linear_weight(w, p + n + ".weight", dtype, device, self.quant))
                if self.spec.qkv_bias:
                    bs.append(w.get(p + n + ".bias", dtype, device))
        self.kv_split = [x.shape[0] for x in ws]              # [K_0, V_0, K_1, V_1, ...]
        self.kv_proj_swiftkv = make_linear(ws, torch.cat(bs) if bs else None, pack, self.quant)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv: KVCache,
                attn_all: list, slots: list, logits_idx: torch.Tensor,
                attn_logits: list | None = None) -> torch.Tensor:
        h = self.embed(input_ids) if isinstance(self.embed, nn.Module) else F.embedding(input_ids, self.embed)
        if self.embed_scale is not None:
            h = h * self.embed_scale
        tables = [r.tables(positions) for r in self.ropes]     # [(cos, sin) [T, 1, d]] per RoPE base
        stack = self._decode_stack(kv)
        if stack is not None and stack.serves(h, attn_all[0]):     # one C++ call for the layers (same bits)
            h = stack.run(h, *tables[0], slots[0], attn_all[0])
            first = self.num_kv_layers
        else:
            first = 0
        for i in range(first, self.num_kv_layers):
            g = kv.layer_group[i]
            h = self.layers[i](h, *tables[self.layer_rope[i]], kv.layers[i], attn_all[g], slots[g])
        if self.use_swiftkv:
            h = self._swiftkv_tail(h, tables, kv, slots, logits_idx, attn_logits)
        else:
            h = h[logits_idx]
        return self.ops.rms_norm(h, self.norm, self.spec.rms_norm_eps)

    def _decode_stack(self, kv: KVCache):
        """refengine.decode_stack's path for this cache (built on the first step that uses it), or None."""
        if self._stack_kv is not kv:
            self._stack_kv, self._stack = kv, stack_for(self, kv)
        return self._stack

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final-normed hidden rows [N, hidden] -> logits [N, vocab] (lm_head, then the family's soft cap)."""
        logits = self.lm_head(hidden)
        cap = self.spec.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def _swiftkv_tail(self, h, tables, kv: KVCache, slots, logits_idx, attn_logits):
        x = self.ops.rms_norm(h, self.norm_swiftkv, self.spec.rms_norm_eps)
        fused = self.kv_proj_swiftkv(x).split(self.kv_split, dim=-1)    # one GEMM
        for gi, leader in enumerate(self.group_leaders):
            lead = self.layers[leader]
            k = lead.key(fused[2 * gi], *tables[self.layer_rope[leader]])
            kv.layers[leader].write(slots[kv.layer_group[leader]], k, fused[2 * gi + 1])
        if logits_idx.numel() == 0:
            return h[:0]
        h = h[logits_idx]
        picked = [(cos[logits_idx], sin[logits_idx]) for cos, sin in tables]
        for i in range(self.num_kv_layers, self.spec.num_layers):
            h = self.layers[i].forward_swiftkv(h, *picked[self.layer_rope[i]], kv.layers[i],
                                               attn_logits[kv.layer_group[i]])
        return h
