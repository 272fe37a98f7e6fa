"""``SwiftServeLlamaForCausalLM``: Llama in vLLM with SwiftKV, AcrossKV and uniform-rank ZACK.

Registered as ``LlamaSwiftKVForCausalLM`` (Snowflake's SwiftKV checkpoints) and as
``SwiftServeLlamaForCausalLM`` (any Llama checkpoint, e.g. a ZACK one, selected with
``hf_overrides={"architectures": ["SwiftServeLlamaForCausalLM"]}``). Layout: ``layout.py``.

One step over the T tokens vLLM batched (prefill chunks and decodes mixed) is two
compiled units with a few eager lines between them (the shape vLLM's own fast-prefill
models use, so vLLM compiles both and, on CUDA, captures graphs for both):

1. ``HeadUnit`` (compiled, all T rows): embedding, layers ``0..l-1``, then
   ``x = norm_swiftkv(h)``, ONE fused GEMM for the K/V of every SwiftKV group, RoPE on K,
   ZACK on K, and ``write_kv`` into each group's cache (owned by a ``KVWriter``). The writes'
   dummy results are returned so that no compiler can drop them as dead code.
2. eager: the rows that need logits (``fast_prefill_indices``: vLLM's fast prefill already
   padded them to a captured size) are copied into static buffers; the forward context's
   batch descriptor is switched to that row count, so the CUDA-graph wrapper of the tail
   replays the graph captured for it. Python never branches on a tensor's value here.
3. ``TailUnit`` (compiled, selected rows): layers ``l..L-1`` (``kv_sharing_target_layer_name``
   = their group's writer: vLLM allocates one cache per group and narrows their attention
   metadata to the same rows) and the final norm; the rows are written back into h.

Without fast prefill (profiling runs, or a server started without
``kv_sharing_fast_prefill``) every row runs the tail: same outputs, no saving; the model
warns at load and counts those rows (``tail_rows_unnarrowed``, read by the worker's metrics).
Tensor parallelism: heads and the fused projection are sharded per KV head
(``layers.kv_head_ids``). Pipeline parallelism: each rank runs its slice of both units; the
SwiftKV input ``x`` travels beside the hidden state when a rank starts after layer l-1.
Every vLLM symbol comes from ``compat``.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from swiftserve_vllm import compat as V
from swiftserve_vllm.layers import DecoderLayer, KVWriter, head_norm
from swiftserve_vllm.layout import LayoutError, ModelLayout, RankSlice, kv_head_ids, parse_layout, rank_slice
from swiftserve_vllm.weights import load_checkpoint
from swiftserve_vllm.zack import rotate

log = logging.getLogger(__name__)
_DYNAMIC = {"input_ids": 0, "positions": 0, "embeds": 0, "swiftkv_x": 0}


@V.support_torch_compile(dynamic_arg_dims=_DYNAMIC)
class HeadUnit(nn.Module):
    """Embedding (first rank), this rank's layers < l, the SwiftKV K/V of its groups; the final
    norm when there is no tail. Returns (h [T, hidden], x [T, hidden] or None, *write results)."""

    def __init__(self, *, vllm_config, prefix: str = "", layout: ModelLayout, rs: RankSlice):
        super().__init__()
        cfg = vllm_config.model_config.hf_config
        self.layout, self.rs = layout, rs
        if rs.first:
            self.embed_tokens = V.VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleDict({str(i): DecoderLayer(cfg, layout, vllm_config, i, None)
                                     for i in rs.head_layers})
        self.writers = nn.ModuleList(KVWriter(layout, vllm_config, g) for g in rs.groups)
        if rs.owns_split:
            self.norm_swiftkv = V.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        if rs.groups:
            tp = V.get_tensor_model_parallel_world_size()
            kvh = len(kv_head_ids(layout.num_kv_heads, tp, V.get_tensor_model_parallel_rank()))
            # [K; V] widths of each group on this rank (V is r wide per head under ZACK)
            self.sizes = [w for g in rs.groups
                          for w in (kvh * layout.head_dim, kvh * layout.kv_head_size(layout.group_leader(g)))]
            self.kv_proj_swiftkv = V.MergedColumnParallelLinear(
                cfg.hidden_size, [tp * w for w in self.sizes], bias=layout.qkv_bias,
                quant_config=vllm_config.quant_config, prefix="model.kv_proj_swiftkv")   # global sizes, cut per rank
            if layout.qk_norm:             # Qwen3: each group's K through its leader's k_norm
                self.k_norms = nn.ModuleList(V.RMSNorm(layout.head_dim, eps=cfg.rms_norm_eps) for _ in rs.groups)
            self.rotary_swiftkv = V.get_rope(layout.head_dim, max_position=getattr(cfg, "max_position_embeddings", 8192),
                                             rope_parameters=getattr(cfg, "rope_parameters", None), is_neox_style=True)
            for j, g in enumerate(rs.groups if layout.zack else ()):     # each group's key map [kv_heads, d, r]
                r = layout.kv_head_size(layout.group_leader(g))
                self.register_buffer(f"zack_qk_{j}", torch.zeros(kvh, layout.head_dim, r), persistent=False)
        if rs.last and not rs.tail_layers:
            self.norm = V.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor, embeds: torch.Tensor | None,
                swiftkv_x: torch.Tensor | None):
        h = self.embed_tokens(input_ids) if embeds is None else embeds
        for layer in self.layers.values():
            h = layer(positions, h)
        x = self.norm_swiftkv(h) if self.rs.owns_split else swiftkv_x
        deps = []
        if self.rs.groups:
            fused, _ = self.kv_proj_swiftkv(x)                                  # one GEMM for every group
            parts = fused.split(self.sizes, dim=-1)
            for j, writer in enumerate(self.writers):
                k = parts[2 * j]
                if self.layout.qk_norm:
                    k = head_norm(self.k_norms[j], k, self.layout.head_dim)
                k, _ = self.rotary_swiftkv(positions, k.contiguous(), None)   # RoPE on K
                if self.layout.zack:
                    k = rotate(k, getattr(self, f"zack_qk_{j}"))
                deps.append(V.write_kv(writer.attn, k, parts[2 * j + 1]))
        if self.rs.last and not self.rs.tail_layers:
            h = self.norm(h)
        return (h, x, *deps)


@V.support_torch_compile(dynamic_arg_dims={"positions": 0, "hidden_states": 0})
class TailUnit(nn.Module):
    """This rank's layers >= l on the rows that need logits, then the final norm (last rank)."""

    def __init__(self, *, vllm_config, prefix: str = "", layout: ModelLayout, rs: RankSlice):
        super().__init__()
        cfg = vllm_config.model_config.hf_config
        self.rs = rs
        self.layers = nn.ModuleDict({str(i): DecoderLayer(cfg, layout, vllm_config, i,
                                                          KVWriter.name(layout, layout.group_of(i)))
                                     for i in rs.tail_layers})
        if rs.last:
            self.norm = V.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        h = hidden_states
        for layer in self.layers.values():
            h = layer(positions, h)
        return self.norm(h) if self.rs.last else h


class SwiftServeLlamaModel(nn.Module):
    def __init__(self, *, vllm_config, prefix: str = "model"):
        super().__init__()
        cfg = vllm_config.model_config.hf_config
        self.layout = layout = parse_layout(cfg.to_dict())
        self.model_dir = str(vllm_config.model_config.model)      # ZACK's rotations file is read from here
        pp = V.get_pp_group()
        try:
            self.rs = rs = rank_slice(layout, *V.get_pp_indices(layout.num_layers, pp.rank_in_group, pp.world_size),
                                      first=pp.is_first_rank, last=pp.is_last_rank)
        except LayoutError as exc:
            raise ValueError(str(exc)) from None
        with V.set_model_tag("swiftserve_head"):
            self.head = HeadUnit(vllm_config=vllm_config, prefix=f"{prefix}.head", layout=layout, rs=rs)
        self.tail = None
        if rs.tail_layers:
            with V.set_model_tag("swiftserve_tail"):
                self.tail = TailUnit(vllm_config=vllm_config, prefix=f"{prefix}.tail", layout=layout, rs=rs)
            n = vllm_config.scheduler_config.max_num_batched_tokens
            # Static row buffers of the tail (CUDA graphs replay on fixed addresses); buffers, so they
            # are made on, and move with, the model's device.
            self.register_buffer("rows", torch.arange(n, dtype=torch.long), persistent=False)
            self.register_buffer("tail_positions", torch.zeros(n, dtype=torch.long), persistent=False)
            self.register_buffer("tail_hidden", torch.zeros(n, cfg.hidden_size), persistent=False)
            self.tail_attn = f"model.layers.{rs.tail_layers[-1]}.self_attn.attn"
            self.fast_prefill = bool(vllm_config.cache_config.kv_sharing_fast_prefill)
            if not self.fast_prefill:
                log.warning("SwiftKV checkpoint served without kv_sharing_fast_prefill: every prompt token runs "
                            "layers >= %d (no prefill saving). Start vLLM with --kv-sharing-fast-prefill "
                            "(swiftserve-worker --engine vllm turns it on).", layout.num_kv_layers)
        # Host-side counters for tests and metrics (eager code: not advanced by a replayed full CUDA graph).
        self.tokens_head = 0            # rows through this rank's head
        self.tokens_tail = 0            # rows through this rank's tail
        self.tail_rows_unnarrowed = 0   # tail rows of real steps that fast prefill did not narrow

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
        rs = self.rs
        if rs.first:
            embeds, x_in = inputs_embeds, None
        else:
            embeds = intermediate_tensors["hidden_states"]
            x_in = intermediate_tensors["swiftkv_x"] if rs.uses_incoming_x else None
        out = self.head(input_ids, positions, embeds, x_in)
        h, x = out[0], out[1]
        if x is not None and not rs.last and self.tail is not None:
            x = x.clone()                   # outlives the tail's run (see _tail)
        self.tokens_head += int(positions.shape[0])
        if self.tail is not None:
            h = self._tail(positions, h)
        if rs.last:
            return h
        tensors = {"hidden_states": h}
        if self.layout.swiftkv:
            tensors["swiftkv_x"] = x if x is not None else h      # placeholder before l-1: never read
        return V.IntermediateTensors(tensors)

    def _tail(self, positions: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        idx, n = V.fast_prefill_indices(self.tail_attn)
        if idx is None:                     # no narrowing: every row, in order
            idx = self.rows[:positions.shape[0]]
            if not self.fast_prefill and V.in_real_step():
                self.tail_rows_unnarrowed += int(positions.shape[0])
        else:
            # Copied before the tail runs: vLLM hands a unit's output out as a view of its CUDA-graph
            # pool, which the tail's replay may reuse (vLLM's fast-prefill models clone here too).
            h = h.clone()
        m = int(idx.shape[0])               # padded row count (host-side size, no sync)
        pos, hid = self.tail_positions[:m], self.tail_hidden[:m]
        torch.index_select(positions, 0, idx, out=pos)
        torch.index_select(h, 0, idx, out=hid)
        self.tokens_tail += m if n is None else int(n)
        with V.batch_tokens(m):
            t = self.tail(pos, hid)
        if n is None:
            return t
        h[idx[:n]] = t[:n]
        return h


class SwiftServeLlamaForCausalLM(nn.Module, V.SupportsPP):
    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__()
        cfg = vllm_config.model_config.hf_config
        self.config = cfg
        self.model = SwiftServeLlamaModel(vllm_config=vllm_config, prefix="model")
        if self.model.layout.swiftkv:
            V.fix_kv_sharing_in_mixed_head_groups()     # built in the worker process, before its KV set-up
        if V.uses_v2_model_runner(vllm_config):          # only where vLLM forces V2 past the plugin's reason
            log.warning("vLLM runs this model on its Model Runner V2, where the plugin was never verified "
                        "(its KV-sharing fix is patched on the V1 runner); unset what forces V2 to use V1")
        if self.model.rs.last:
            self.lm_head = V.ParallelLMHead(cfg.vocab_size, cfg.hidden_size, quant_config=vllm_config.quant_config,
                                            prefix="lm_head")
            if getattr(cfg, "tie_word_embeddings", False) and self.model.rs.first:
                self.lm_head = self.lm_head.tie_weights(self.model.head.embed_tokens)
            self.logits_processor = V.LogitsProcessor(cfg.vocab_size, scale=getattr(cfg, "logit_scale", 1.0))
        keys = ["hidden_states"] + (["swiftkv_x"] if self.model.layout.swiftkv else [])
        self.make_empty_intermediate_tensors = V.make_empty_intermediate_tensors_factory(keys, cfg.hidden_size)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.head.embed_tokens(input_ids)

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, **kwargs):
        return self.model(input_ids, positions, intermediate_tensors, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.logits_processor(self.lm_head, hidden_states)

    def load_weights(self, weights) -> set[str]:
        return load_checkpoint(self, weights)


def token_counters(model: nn.Module) -> tuple[int, int]:
    """(tokens_head, tokens_tail) of a loaded model, for ``LLM.apply_model`` (module level so
    it pickles by reference into vLLM's worker process); (-1, -1) for other model classes."""
    inner = getattr(model, "model", None)
    return int(getattr(inner, "tokens_head", -1)), int(getattr(inner, "tokens_tail", -1))
