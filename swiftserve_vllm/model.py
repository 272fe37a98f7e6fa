"""``SwiftServeLlamaForCausalLM``: Llama in vLLM with SwiftKV, AcrossKV and uniform-rank ZACK.

Registered as ``LlamaSwiftKVForCausalLM`` (Snowflake's SwiftKV checkpoints) and as
``SwiftServeLlamaForCausalLM`` (any Llama checkpoint, e.g. a ZACK one, selected with
``hf_overrides={"architectures": ["SwiftServeLlamaForCausalLM"]}``). Layout: see
``layout.py``. Forward of one step over T tokens (flattened, as vLLM runs it):

1. layers 0..l-1 run on all T tokens as in Llama (each owns its KV cache);
2. x = norm_swiftkv(h); ONE fused GEMM gives K/V of every SwiftKV group; RoPE on K;
   ``write_kv`` stores them in the group's cache, owned by a KV-only "writer" attention
   layer (``model.swiftkv_caches.{L+gi}.attn``) that never computes attention;
3. layers l..L-1 have ``kv_sharing_target_layer_name`` = their group's writer, so vLLM
   allocates ONE cache per group (AcrossKV saves memory for real) and, with
   ``kv_sharing_fast_prefill``, marks them (the trailing KV-sharing layers) eligible: their
   attention metadata is narrowed to the tokens that need logits. Only those tokens
   (``fast_prefill_indices``) continue through layers >= l; the rest skip them.
   Without fast prefill (or in profiling runs) all T tokens run them: same outputs, no saving.

ZACK (uniform rank r): every cache stores r dims per head; V/O folded at load, Q/K rotated
after RoPE (``zack.py``); scale stays d**-0.5. Every vLLM symbol comes from ``compat``.
Limits: pipeline parallelism is refused; ZACK needs tensor_parallel_size 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import torch
from torch import nn

from swiftserve_vllm import compat as V
from swiftserve_vllm import zack as Z
from swiftserve_vllm.layout import ModelLayout, parse_layout


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


class _Layer(nn.Module):
    """One decoder layer. ``kv_source``: name of the writer attention whose cache it reads
    (SwiftKV later layers); None: it projects and writes its own K/V."""

    def __init__(self, cfg, layout: ModelLayout, idx: int, vllm_config, prefix: str, kv_source: str | None):
        super().__init__()
        tp = V.get_tensor_model_parallel_world_size()
        quant = vllm_config.quant_config
        d, r = layout.head_dim, layout.kv_head_size
        self.num_heads = layout.num_heads // tp
        self.num_kv_heads = max(1, layout.num_kv_heads // tp)
        self.q_size, self.k_size, self.v_size = self.num_heads * d, self.num_kv_heads * d, self.num_kv_heads * r
        self.idx = idx
        self.later = kv_source is not None
        qkv_bias = bool(getattr(cfg, "attention_bias", False) or getattr(cfg, "qkv_bias", False))
        p = f"{prefix}.self_attn"
        if self.later:
            self.q_proj = V.ColumnParallelLinear(cfg.hidden_size, layout.num_heads * d, bias=qkv_bias,
                                                 quant_config=quant, prefix=f"{p}.q_proj_swiftkv")
        else:
            self.qkv_proj = V.QKVParallelLinear(cfg.hidden_size, d, layout.num_heads, layout.num_kv_heads,
                                                bias=qkv_bias, quant_config=quant, prefix=f"{p}.qkv_proj",
                                                v_head_size=r)
        self.o_proj = V.RowParallelLinear(layout.num_heads * r, cfg.hidden_size,
                                          bias=bool(getattr(cfg, "attention_bias", False)),
                                          quant_config=quant, prefix=f"{p}.o_proj")
        self.rotary_emb = V.get_rope(d, max_position=getattr(cfg, "max_position_embeddings", 8192),
                                     rope_parameters=getattr(cfg, "rope_parameters", None), is_neox_style=True)
        self.attn = V.Attention(self.num_heads, r, d ** -0.5, num_kv_heads=self.num_kv_heads,
                                cache_config=vllm_config.cache_config, quant_config=quant, prefix=f"{p}.attn",
                                kv_sharing_target_layer_name=kv_source)
        self.input_layernorm = V.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = V.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.mlp = _MLP(cfg, quant, f"{prefix}.mlp")
        self.r_qk: torch.Tensor | None = None      # ZACK key map [kv_heads, d, r], set by the model
        self.r_q: torch.Tensor | None = None       # ZACK query map (= r_qk in the paper's basis)

    def forward(self, positions: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        x = self.input_layernorm(h)
        if self.later:
            q, _ = self.q_proj(x)
            q, _ = self.rotary_emb(positions, q, None)
            k = v = None
        else:
            qkv, _ = self.qkv_proj(x)
            q, k, v = qkv.split([self.q_size, self.k_size, self.v_size], dim=-1)
            q, k = self.rotary_emb(positions, q, k)
            if self.r_qk is not None:
                k = Z.rotate(k, self.r_qk)
        if self.r_q is not None:
            q = Z.rotate(q, self.r_q)
        a = self.attn(q, k, v)
        o, _ = self.o_proj(a)
        h = h + o
        return h + self.mlp(self.post_attention_layernorm(h))


class _KVWriter(nn.Module):
    """Owns one SwiftKV group's cache; only ``write_kv`` ever touches it."""

    def __init__(self, layout: ModelLayout, vllm_config, prefix: str):
        super().__init__()
        tp = V.get_tensor_model_parallel_world_size()
        self.attn = V.Attention(layout.num_heads // tp, layout.kv_head_size, layout.head_dim ** -0.5,
                                num_kv_heads=max(1, layout.num_kv_heads // tp),
                                cache_config=vllm_config.cache_config, quant_config=vllm_config.quant_config,
                                prefix=f"{prefix}.attn")


class SwiftServeLlamaModel(nn.Module):
    def __init__(self, *, vllm_config, prefix: str = "model"):
        super().__init__()
        cfg = vllm_config.model_config.hf_config
        if V.get_pp_group().world_size > 1:
            raise NotImplementedError("SwiftServe's vLLM model does not support pipeline parallelism")
        self.layout = layout = parse_layout(cfg.to_dict())
        if layout.zack_rank is not None and V.get_tensor_model_parallel_world_size() > 1:
            raise NotImplementedError("ZACK in vLLM supports tensor_parallel_size=1 only")
        L, l = layout.num_layers, layout.num_kv_layers
        self.embed_tokens = V.VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size)
        # Construction order matters: a KV-sharing target must exist before its readers,
        # and vLLM marks only the TRAILING KV-sharing layers fast-prefill eligible.
        layers = [_Layer(cfg, layout, i, vllm_config, f"{prefix}.layers.{i}", None) for i in range(l)]
        self.swiftkv_caches = nn.ModuleList(
            _KVWriter(layout, vllm_config, f"{prefix}.swiftkv_caches.{L + gi}")
            for gi in range(len(layout.group_leaders)))
        for i in range(l, L):
            writer = self.swiftkv_caches[layout.group_leaders.index(layout.leader_of(i))]
            layers.append(_Layer(cfg, layout, i, vllm_config, f"{prefix}.layers.{i}", writer.attn.layer_name))
        self.layers = nn.ModuleList(layers)
        self.norm = V.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        if layout.swiftkv:
            tp = V.get_tensor_model_parallel_world_size()
            kv = max(1, layout.num_kv_heads // tp) * tp
            sizes = [kv * layout.head_dim, kv * layout.kv_head_size] * len(layout.group_leaders)
            self.norm_swiftkv = V.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
            self.kv_proj_swiftkv = V.MergedColumnParallelLinear(
                cfg.hidden_size, sizes, bias=bool(getattr(cfg, "attention_bias", False)),
                quant_config=vllm_config.quant_config, prefix=f"{prefix}.kv_proj_swiftkv")
            self.rotary_swiftkv = self.layers[l].rotary_emb
        self.zack: Z.ZackRotations | None = None
        if layout.zack_rank is not None:
            path = Path(vllm_config.model_config.model) / layout.zack_file
            self.zack = Z.ZackRotations(path, L, layout.zack_rank)
            dtype = vllm_config.model_config.dtype
            for i, layer in enumerate(self.layers):
                layer.r_qk = self.zack.qk[layout.leader_of(i)].to(dtype)
                layer.r_q = self.zack.q[layout.leader_of(i)].to(dtype)
        # Tokens seen by layers < l and by layers >= l since start (what the tests read
        # through ``LLM.apply_model`` to see prefill tokens skip the later layers).
        self.tokens_head = 0
        self.tokens_tail = 0

    def _write_swiftkv(self, positions: torch.Tensor, h: torch.Tensor) -> None:
        lay = self.layout
        fused, _ = self.kv_proj_swiftkv(self.norm_swiftkv(h))             # one GEMM for every group
        k_size = self.layers[-1].k_size
        v_size = self.layers[-1].v_size
        parts = fused.split([k_size, v_size] * len(lay.group_leaders), dim=-1)
        for gi, leader in enumerate(lay.group_leaders):
            k, v = parts[2 * gi], parts[2 * gi + 1]
            k, _ = self.rotary_swiftkv(positions, k.contiguous(), None)   # RoPE on K (K as the "query")
            if self.layers[leader].r_qk is not None:
                k = Z.rotate(k, self.layers[leader].r_qk)
            V.write_kv(self.swiftkv_caches[gi].attn, k, v)

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
        h = inputs_embeds if inputs_embeds is not None else self.embed_tokens(input_ids)
        lay = self.layout
        self.tokens_head += int(h.shape[0])
        for layer in self.layers[:lay.num_kv_layers]:
            h = layer(positions, h)
        if lay.swiftkv:
            self._write_swiftkv(positions, h)
            idx, n = V.fast_prefill_indices(self.layers[-1].attn.layer_name)
            if idx is None:
                tail, tail_pos = h, positions
            else:
                tail, tail_pos = h[idx], positions[idx]
            self.tokens_tail += int(tail.shape[0])
            for layer in self.layers[lay.num_kv_layers:]:
                tail = layer(tail_pos, tail)
            if idx is None:
                h = tail
            else:
                h = h.clone()
                h[idx[:n]] = tail[:n]
        return self.norm(h)


class SwiftServeLlamaForCausalLM(nn.Module):
    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__()
        cfg = vllm_config.model_config.hf_config
        self.config = cfg
        self.model = SwiftServeLlamaModel(vllm_config=vllm_config, prefix=f"{prefix}.model" if prefix else "model")
        self.lm_head = V.ParallelLMHead(cfg.vocab_size, cfg.hidden_size, quant_config=vllm_config.quant_config,
                                        prefix=f"{prefix}.lm_head" if prefix else "lm_head")
        if getattr(cfg, "tie_word_embeddings", False):
            self.lm_head = self.lm_head.tie_weights(self.model.embed_tokens)
        self.logits_processor = V.LogitsProcessor(cfg.vocab_size, scale=getattr(cfg, "logit_scale", 1.0))

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, **kwargs):
        return self.model(input_ids, positions, intermediate_tensors, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.logits_processor(self.lm_head, hidden_states)

    # ---- weights ------------------------------------------------------------------------
    def _target(self, name: str) -> tuple[str, object] | None:
        """Checkpoint name -> (parameter name, shard id or None); None = not used."""
        lay = self.model.layout
        if name.startswith("lm_head.") and getattr(self.config, "tie_word_embeddings", False):
            return None
        if "rotary_emb.inv_freq" in name or ".zack_" in name:
            return None
        parts = name.split(".")
        if len(parts) > 3 and parts[0] == "model" and parts[1] == "layers":
            i = int(parts[2])
            rest = ".".join(parts[3:])
            later = lay.swiftkv and i >= lay.num_kv_layers
            for proj, shard in (("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v")):
                if rest.startswith(f"self_attn.{proj}."):
                    return None if later else (f"model.layers.{i}.qkv_proj.{parts[-1]}", shard)
            if rest.startswith("self_attn.q_proj_swiftkv."):
                return (f"model.layers.{i}.q_proj.{parts[-1]}", None) if later else None
            for j, proj in enumerate(("k_proj_swiftkv", "v_proj_swiftkv")):
                if rest.startswith(f"self_attn.{proj}."):
                    if not later or i not in lay.group_leaders:
                        return None
                    shard = 2 * lay.group_leaders.index(i) + j
                    return f"model.kv_proj_swiftkv.{parts[-1]}", shard
            for j, proj in enumerate(("gate_proj", "up_proj")):
                if rest.startswith(f"mlp.{proj}."):
                    return f"model.layers.{i}.mlp.gate_up_proj.{parts[-1]}", j
            return f"model.layers.{i}.{rest.removeprefix('self_attn.')}", None   # o_proj, norms, down_proj
        if name.startswith("model.norm_swiftkv.") and not lay.swiftkv:
            return None
        return name, None

    def _fold(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """ZACK: fold R_vo into V projections and o_proj at load."""
        zk = self.model.zack
        if zk is None:
            return tensor
        lay = self.model.layout
        parts = name.split(".")
        i = int(parts[2])
        lead = lay.leader_of(i)
        if ".self_attn.v_proj." in name or ".self_attn.v_proj_swiftkv." in name:
            return Z.fold_v(tensor, zk.vo[lead])
        if ".self_attn.o_proj.weight" in name:
            return Z.fold_o(tensor, zk.o[lead], lay.num_heads)
        return tensor

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, tensor in weights:
            target = self._target(name)
            if target is None:
                continue
            pname, shard = target
            if pname not in params:
                raise ValueError(f"checkpoint tensor {name} has no parameter {pname} in {type(self).__name__}")
            if ".layers." in name:
                tensor = self._fold(name, tensor)
            param = params[pname]
            loader = getattr(param, "weight_loader", V.default_weight_loader)
            if shard is None:
                loader(param, tensor)
            else:
                loader(param, tensor, shard)
            loaded.add(pname)
        if getattr(self.config, "tie_word_embeddings", False):
            loaded.add("lm_head.weight")
        return loaded


def token_counters(model: nn.Module) -> tuple[int, int]:
    """(tokens_head, tokens_tail) of a loaded model, for ``LLM.apply_model`` (module level so
    it pickles by reference into vLLM's worker process); (-1, -1) for other model classes."""
    inner = getattr(model, "model", None)
    return int(getattr(inner, "tokens_head", -1)), int(getattr(inner, "tokens_tail", -1))
