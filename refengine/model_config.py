"""HF ``config.json`` -> ModelSpec: the facts about a Llama-family model the engine needs.

Supported: Llama (1/2/3/3.1 incl. ``llama3`` RoPE scaling), Mistral and Qwen2 (q/k/v
biases; both with or without sliding windows), Qwen3 (QK-norm), Gemma 3 text
(``gemma3_text``: sliding-window layers with their own RoPE base, QK-norm, GeGLU,
``(1 + w)`` norms, scaled embeddings; see ``refengine.model_families``), tied embeddings,
GQA, and the SwiftKV variant of each (``model_type: <family>_swiftkv``; fields
``swiftkv``, ``num_key_value_layers``, ``key_value_group_size``; Snowflake's
``llama_swiftkv``). Both the transformers<5 (``rope_theta`` + ``rope_scaling``) and >=5
(``rope_parameters``) spellings are read. No torch here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from refengine import swiftkv_format
from refengine.model_families import FamilyError, family_fields, global_rope

SUPPORTED_MODEL_TYPES = {"llama", "llama_swiftkv", "mistral", "qwen2", "qwen2_swiftkv", "qwen3", "qwen3_swiftkv",
                         "gemma3_text", "gemma3_text_swiftkv"}


class ModelConfigError(ValueError):
    """A model directory the engine cannot serve; the message says why."""


@dataclass(frozen=True)
class ModelSpec:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    hidden_act: str
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    # SwiftKV (num_key_value_layers == num_layers means "no SwiftKV").
    swiftkv: bool = False
    num_key_value_layers: int = 0
    key_value_group_size: int = 1
    # Family switches (refengine.model_families; the defaults are Llama's).
    qk_norm: bool = False
    norm_offset: float = 0.0
    embed_scale: float = 1.0
    sandwich_norm: bool = False
    attn_scale: float | None = None            # None: head_dim ** -0.5
    layer_windows: tuple = ()                  # per layer: sliding window or None; () = no window anywhere
    local_rope_theta: float | None = None      # RoPE base of windowed layers (None: the global one)
    final_logit_softcapping: float | None = None
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    def window(self, layer: int) -> int | None:
        return self.layer_windows[layer] if self.layer_windows else None

    @property
    def is_swiftkv_checkpoint(self) -> bool:
        return "swiftkv" in self.model_type or self.raw.get("swiftkv") is not None


def _as_tuple(value) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value)
    return (int(value),)


def _rope(cfg: dict) -> tuple[float, dict | None]:
    params = cfg.get("rope_parameters")
    if isinstance(params, dict):
        theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
        rope_type = params.get("rope_type", params.get("type", "default"))
        scaling = None if rope_type == "default" else dict(params, rope_type=rope_type)
        return theta, scaling
    theta = float(cfg.get("rope_theta", 10000.0))
    scaling = cfg.get("rope_scaling")
    if scaling:
        scaling = dict(scaling)
        scaling["rope_type"] = scaling.get("rope_type", scaling.get("type", "default"))
        if scaling["rope_type"] == "default":
            scaling = None
    return theta, scaling or None


def parse_model_config(cfg: dict, generation_cfg: dict | None = None) -> ModelSpec:
    model_type = cfg.get("model_type", "llama")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelConfigError(
            f"model_type {model_type!r} is not supported by the reference engine "
            f"(supported: {', '.join(sorted(SUPPORTED_MODEL_TYPES))})"
        )
    hidden = int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    layers = int(cfg["num_hidden_layers"])
    if heads % kv_heads:
        raise ModelConfigError(f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}")
    if model_type == "gemma3" or "text_config" in cfg:
        raise ModelConfigError("multimodal Gemma 3 (model_type 'gemma3') is not supported; serve a text-only "
                               "checkpoint (model_type 'gemma3_text')")
    try:
        family = family_fields(model_type, cfg, layers, head_dim, hidden)
    except FamilyError as exc:
        raise ModelConfigError(str(exc)) from None
    theta, scaling = _rope(global_rope(model_type, cfg))
    if scaling and scaling["rope_type"] not in ("linear", "llama3", "yarn", "dynamic"):
        raise ModelConfigError(f"rope scaling {scaling['rope_type']!r} is not supported")
    is_qwen = model_type.startswith("qwen2")
    eos = _as_tuple((generation_cfg or {}).get("eos_token_id")) or _as_tuple(cfg.get("eos_token_id"))
    try:                                        # the format's rules (absent l: every layer has its own KV)
        sk = swiftkv_format.read_fields(cfg, layers)
    except swiftkv_format.SwiftKVFormatError as exc:
        raise ModelConfigError(str(exc)) from None
    swiftkv, kv_layers, group = sk.flag, sk.num_kv_layers, sk.group_size
    wins = family["layer_windows"]
    if swiftkv and wins and group > 1:
        for lead in swiftkv_format.group_leaders(layers, kv_layers, group):
            kinds = {wins[i] for i in range(lead, min(lead + group, layers))}
            if len(kinds) > 1:
                raise ModelConfigError(f"AcrossKV group of layers {lead}..{min(lead + group, layers) - 1} mixes "
                                       "sliding-window and global layers (different windows and RoPE bases cannot "
                                       "share one K/V); choose a group size that keeps layer types apart")
    return ModelSpec(
        model_type=model_type,
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=bool(cfg.get("attention_bias", False)) or is_qwen,
        o_bias=bool(cfg.get("attention_bias", False)) and not is_qwen,
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        hidden_act=family.pop("hidden_act", cfg.get("hidden_act", "silu")),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=eos,
        swiftkv=sk.on,
        num_key_value_layers=kv_layers if swiftkv else layers,
        key_value_group_size=group if swiftkv else 1,
        raw=cfg,
        **family,
    )


def load_model_spec(model_dir: str | Path) -> ModelSpec:
    model_dir = Path(model_dir)
    path = model_dir / "config.json"
    if not path.is_file():
        raise ModelConfigError(f"{model_dir} has no config.json (expected a Hugging Face model directory)")
    cfg = json.loads(path.read_text())
    gen_path = model_dir / "generation_config.json"
    gen = json.loads(gen_path.read_text()) if gen_path.is_file() else None
    return parse_model_config(cfg, gen)
