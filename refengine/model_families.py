"""What distinguishes the decoder families the engine serves, read from an HF ``config.json``. No torch.

Every family is the same pre-norm decoder (``refengine.models.llama``); a family only
switches parts of it on. ``family_fields(model_type, cfg, ...)`` returns the
``ModelSpec`` fields below (the defaults are Llama's):

| field | Llama / Mistral / Qwen2 | Qwen3 | Gemma 3 (``gemma3_text``) |
|---|---|---|---|
| ``qk_norm``: RMSNorm over each head of q and k, before RoPE | no | yes | yes |
| ``norm_offset``: RMSNorm weight applied as ``offset + w`` | 0 | 0 | 1 |
| ``embed_scale``: embeddings multiplied by it | 1 | 1 | sqrt(hidden) |
| ``sandwich_norm``: norms after attention and MLP too | no | no | yes |
| ``hidden_act`` of the gated MLP | silu | silu | gelu (tanh) |
| ``attn_scale``: softmax scale | head_dim^-1/2 | same | query_pre_attn_scalar^-1/2 |
| ``layer_windows``: per layer, the sliding window or None | Mistral: every layer; Qwen2: layers >= max_window_layers when use_sliding_window | same as Qwen2 | ``layer_types`` (5 sliding : 1 global) |
| ``local_rope_theta``: RoPE base of windowed layers | same as global | same | rope_local_base_freq |

A window ``W`` means: the query at position ``p`` attends to keys ``p-W+1 .. p`` (transformers'
``kv_idx > q_idx - sliding_window``). ``layer_windows`` is ``()`` when no layer has one.
"""

from __future__ import annotations

import math

# Families by model_type (SwiftKV variants share their base family's fields).
GEMMA3 = ("gemma3_text", "gemma3_text_swiftkv")
QWEN3 = ("qwen3", "qwen3_swiftkv")


class FamilyError(ValueError):
    """A config the engine cannot serve; the message says why."""


def _layer_types(model_type: str, cfg: dict, num_layers: int) -> list[str]:
    """``full_attention`` / ``sliding_attention`` per layer, as transformers derives them."""
    given = cfg.get("layer_types")
    if given:
        if len(given) != num_layers:
            raise FamilyError(f"layer_types has {len(given)} entries for {num_layers} layers")
        return list(given)
    if model_type in GEMMA3:
        pattern = int(cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern") or 6)
        return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(num_layers)]
    if model_type.startswith("mistral"):
        return ["sliding_attention" if cfg.get("sliding_window") else "full_attention"] * num_layers
    if model_type.startswith(("qwen2", "qwen3")) and cfg.get("use_sliding_window"):
        first = int(cfg.get("max_window_layers", num_layers))
        return ["sliding_attention" if i >= first else "full_attention" for i in range(num_layers)]
    return ["full_attention"] * num_layers


def layer_windows(model_type: str, cfg: dict, num_layers: int) -> tuple[int | None, ...]:
    window = cfg.get("sliding_window")
    if model_type.startswith(("qwen2", "qwen3")) and not cfg.get("use_sliding_window"):
        window = None                              # transformers ignores the window unless asked
    types = _layer_types(model_type, cfg, num_layers)
    bad = sorted(set(types) - {"full_attention", "sliding_attention"})
    if bad:
        raise FamilyError(f"layer types {bad} are not supported (full_attention, sliding_attention)")
    if not window or "sliding_attention" not in types:
        return ()
    if int(window) < 1:
        raise FamilyError(f"sliding_window={window} must be >= 1")
    return tuple(int(window) if t == "sliding_attention" else None for t in types)


def family_fields(model_type: str, cfg: dict, num_layers: int, head_dim: int, hidden: int) -> dict:
    """The family-specific ``ModelSpec`` fields (see the table above)."""
    windows = layer_windows(model_type, cfg, num_layers)
    out: dict = {"layer_windows": windows, "attn_scale": head_dim ** -0.5}
    if model_type in QWEN3:
        out["qk_norm"] = True
    if model_type in GEMMA3:
        if cfg.get("attn_logit_softcapping") is not None:
            raise FamilyError("attn_logit_softcapping (Gemma 2's attention soft cap) is not supported")
        if cfg.get("use_bidirectional_attention"):
            raise FamilyError("use_bidirectional_attention is not supported (causal decoders only)")
        params = cfg.get("rope_parameters") or {}
        local = params.get("sliding_attention") or {}
        if local.get("rope_type", "default") != "default":
            raise FamilyError(f"rope scaling {local.get('rope_type')!r} on sliding layers is not supported")
        out.update(qk_norm=True, norm_offset=1.0, embed_scale=math.sqrt(hidden), sandwich_norm=True,
                   attn_scale=float(cfg.get("query_pre_attn_scalar", head_dim)) ** -0.5,
                   local_rope_theta=float(local.get("rope_theta", cfg.get("rope_local_base_freq", 10000.0))),
                   hidden_act=cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh",
                   final_logit_softcapping=cfg.get("final_logit_softcapping"))
    if out.get("hidden_act", cfg.get("hidden_act", "silu")) not in ("silu", "gelu_pytorch_tanh"):
        raise FamilyError(f"hidden activation {out.get('hidden_act', cfg.get('hidden_act'))!r} is not supported "
                          "(silu, gelu_pytorch_tanh)")
    return out


def global_rope(model_type: str, cfg: dict) -> dict:
    """The config with the global layers' RoPE where ``model_config._rope`` reads it (Gemma 3 keeps
    one ``rope_parameters`` entry per layer type)."""
    params = cfg.get("rope_parameters")
    if model_type in GEMMA3 and isinstance(params, dict) and "full_attention" in params:
        return dict(cfg, rope_parameters=params["full_attention"])
    return cfg
