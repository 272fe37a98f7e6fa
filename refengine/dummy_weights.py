"""Random weights shaped by a ``ModelSpec`` (``EngineConfig.load_format = "dummy"``), for benchmarks.

Same interface as ``WeightSource`` (``name in w``, ``names()``, ``get(name, dtype, device)``,
``close()``) and the same tensor names as an HF Llama checkpoint, plus the SwiftKV
extras (``norm_swiftkv``, ``q/k/v_proj_swiftkv`` of every layer >= l) when the spec is a
SwiftKV one, and each family's extra norms (QK-norm, Gemma's sandwich norms). Tensors are
drawn on the target device (no host copy of an 8B model): matrices ~ N(0, 0.02^2), norm
weights of effective scale 1 (0 for Gemma's ``1 + w`` norms), biases 0. Each tensor has its own seed derived
from its name, so a tensor is the same whichever order the model asks for it.
"""

from __future__ import annotations

import zlib

import torch

from refengine.model_config import ModelSpec


def _shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    H, I, d = spec.hidden_size, spec.intermediate_size, spec.head_dim
    q, kv = spec.num_heads * d, spec.num_kv_heads * d
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (spec.vocab_size, H), "model.norm.weight": (H,)}
    if not spec.tie_word_embeddings:
        out["lm_head.weight"] = (spec.vocab_size, H)
    swift = spec.swiftkv and spec.num_key_value_layers < spec.num_layers
    if swift:
        out["model.norm_swiftkv.weight"] = (H,)
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        layer = {"input_layernorm.weight": (H,), "post_attention_layernorm.weight": (H,),
                 "self_attn.q_proj.weight": (q, H), "self_attn.k_proj.weight": (kv, H),
                 "self_attn.v_proj.weight": (kv, H), "self_attn.o_proj.weight": (H, q),
                 "mlp.gate_proj.weight": (I, H), "mlp.up_proj.weight": (I, H), "mlp.down_proj.weight": (H, I)}
        if spec.qkv_bias:
            layer.update({"self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,), "self_attn.v_proj.bias": (kv,)})
        if spec.o_bias:
            layer["self_attn.o_proj.bias"] = (H,)
        if spec.qk_norm:
            layer.update({"self_attn.q_norm.weight": (d,), "self_attn.k_norm.weight": (d,)})
        if spec.sandwich_norm:
            layer.update({"pre_feedforward_layernorm.weight": (H,), "post_feedforward_layernorm.weight": (H,)})
        if swift and i >= spec.num_key_value_layers:
            layer["self_attn.q_proj_swiftkv.weight"] = (q, H)
            if (i - spec.num_key_value_layers) % spec.key_value_group_size == 0:
                layer.update({"self_attn.k_proj_swiftkv.weight": (kv, H), "self_attn.v_proj_swiftkv.weight": (kv, H)})
        out.update({p + k: v for k, v in layer.items()})
    return out


class DummyWeights:
    def __init__(self, spec: ModelSpec, seed: int = 0) -> None:
        self._shapes = _shapes(spec)
        self.seed = seed
        self.norm_one = 1.0 - spec.norm_offset     # a norm weight whose effective scale is 1

    def __contains__(self, name: str) -> bool:
        return name in self._shapes

    def names(self) -> list[str]:
        return list(self._shapes)

    def get(self, name: str, dtype: torch.dtype | None = None, device: torch.device | str = "cpu") -> torch.Tensor:
        if name not in self._shapes:
            raise KeyError(f"no tensor {name!r} in a model of this shape")
        shape, dtype = self._shapes[name], dtype or torch.float32
        if name.endswith("norm.weight") or name.endswith("layernorm.weight") or "norm_swiftkv" in name:
            return torch.full(shape, self.norm_one, dtype=dtype, device=device)
        if name.endswith(".bias"):
            return torch.zeros(shape, dtype=dtype, device=device)
        g = torch.Generator(device=device).manual_seed(self.seed * 1_000_003 + zlib.crc32(name.encode()))
        return (torch.randn(shape, generator=g, dtype=torch.float32, device=device) * 0.02).to(dtype)

    def close(self) -> None:
        return None
