"""The SwiftKV checkpoint format (Snowflake's, extended to more families): its one definition of
the ``config.json`` fields and the extra tensors, read by the reference engine
(``refengine.model_config``) and the vLLM plugin (``swiftserve_vllm.layout``), written by
``modelkit.swiftkv``. No torch, no vLLM.

config.json: ``"swiftkv": true``, ``"num_key_value_layers": l``, ``"key_value_group_size": g``.
Absent (or null) ``l`` means every layer has its own K/V (l = L), absent ``g`` means 1; an
explicit ``l`` outside [1, L] or ``g < 1`` is an error (not "no SwiftKV"). SwiftKV applies when
the flag is set and ``l < L`` (``SwiftKVFields.on``); a reader serving the base model uses
l = L, g = 1.

Tensors beside the base model's: ``model.norm_swiftkv.weight``; for every layer i >= l
``model.layers.{i}.self_attn.q_proj_swiftkv``; for the first layer of each group of g
(i = l, l+g, ...) ``k_proj_swiftkv`` and ``v_proj_swiftkv`` (``.weight``, and ``.bias`` where
the model has q/k/v biases).
"""

from __future__ import annotations

from dataclasses import dataclass

NORM_TENSOR = "model.norm_swiftkv.weight"


class SwiftKVFormatError(ValueError):
    """SwiftKV fields that break the format; the message says which."""


@dataclass(frozen=True)
class SwiftKVFields:
    flag: bool               # "swiftkv": true
    num_kv_layers: int       # l as written (L when absent), in [1, L]
    group_size: int          # g as written (1 when absent), >= 1
    num_layers: int          # L

    @property
    def on(self) -> bool:
        """SwiftKV applies: the flag is set and some layer reads another's K/V."""
        return self.flag and self.num_kv_layers < self.num_layers


def read_fields(cfg: dict, num_layers: int) -> SwiftKVFields:
    """The SwiftKV fields of a ``config.json``, checked (``SwiftKVFormatError``)."""
    raw_l, raw_g = cfg.get("num_key_value_layers"), cfg.get("key_value_group_size")
    l = num_layers if raw_l is None else int(raw_l)
    g = 1 if raw_g is None else int(raw_g)
    if not 1 <= l <= num_layers:
        raise SwiftKVFormatError(f"num_key_value_layers={l} must be in [1, {num_layers}]")
    if g < 1:
        raise SwiftKVFormatError("key_value_group_size must be >= 1")
    return SwiftKVFields(bool(cfg.get("swiftkv", False)), l, g, num_layers)


def config_fields(l: int, g: int) -> dict:
    """What a SwiftKV checkpoint's ``config.json`` adds (besides its architecture and model type)."""
    return {"swiftkv": True, "num_key_value_layers": l, "key_value_group_size": g}


def group_leaders(num_layers: int, l: int, g: int) -> range:
    """The layers holding a group's ``k/v_proj_swiftkv`` (and its cache): l, l+g, ..."""
    return range(l, num_layers, g)


def tensor_names(num_layers: int, l: int, g: int, bias: bool = False) -> list[str]:
    """Every extra tensor name a SwiftKV checkpoint with (l, g) carries."""
    sfx = (".weight", ".bias") if bias else (".weight",)
    names = [NORM_TENSOR]
    leaders = set(group_leaders(num_layers, l, g))
    for i in range(l, num_layers):
        p = f"model.layers.{i}.self_attn."
        names += [p + "q_proj_swiftkv" + s for s in sfx]
        if i in leaders:
            names += [p + n + s for n in ("k_proj_swiftkv", "v_proj_swiftkv") for s in sfx]
    return names
