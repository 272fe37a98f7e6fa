"""SwiftKV checkpoints: conversion from a plain HF model of a served family, and I/O.

Format (compatible with Snowflake's published SwiftKV checkpoints and ArcticTraining; fields and
tensor names defined in ``refengine.swiftkv_format``, which the engine and the vLLM plugin read):
  config.json: "architectures": ["LlamaSwiftKVForCausalLM"], "model_type": "llama_swiftkv",
               "swiftkv": true, "num_key_value_layers": l, "key_value_group_size": g
               (other families: ``ARCH`` below, e.g. "Qwen3SwiftKVForCausalLM" / "qwen3_swiftkv",
               "Gemma3SwiftKVForCausalLM" / "gemma3_text_swiftkv"; every other key of the base
               config is kept, so ``model_type`` minus "_swiftkv" names the base family)
  tensors:     every original tensor, plus
               model.norm_swiftkv.weight
               model.layers.{i}.self_attn.q_proj_swiftkv.weight            for i >= l
               model.layers.{i}.self_attn.{k,v}_proj_swiftkv.weight        for i = l, l+g, l+2g, ...
               (+ .bias where the model has q/k/v biases, e.g. Qwen2)

Initialisation before distillation (papers, section 3.4): q_proj_swiftkv = q_proj;
k/v_proj_swiftkv of a group = mean of the group's k/v_proj; norm_swiftkv = layer l's
input_layernorm.

Families beyond Llama (no new tensor names): ``norm_swiftkv`` follows the family's norm
convention (Gemma 3: applied as ``1 + w``, like its other norms). With QK-norm (Qwen3,
Gemma 3) a later layer's query goes through its own ``q_norm`` and a group's K through the
group leader's ``k_norm``, before RoPE. Sliding windows (Gemma 3; Mistral/Qwen2/Qwen3 with
``use_sliding_window``): a later layer keeps its type: a windowed layer attends only inside
its window (and its KV blocks are freed as the window slides), with its own RoPE base;
SwiftKV changes where K/V come from, not what a layer attends to. An AcrossKV group must
not mix windowed and global layers (one K cannot carry two RoPE bases): refused here.

Storage: the SwiftKV tensors go to ``model-swiftkv.safetensors`` and the base
weights are hard-linked (or copied) unchanged; ``model.safetensors.index.json``
maps every name to its file, as sharded HF checkpoints do.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from refengine import swiftkv_format

if TYPE_CHECKING:
    import torch

SWIFTKV_FILE = "model-swiftkv.safetensors"
ARCH = {"llama": ("LlamaSwiftKVForCausalLM", "llama_swiftkv"),
        "mistral": ("LlamaSwiftKVForCausalLM", "llama_swiftkv"),
        "qwen2": ("Qwen2SwiftKVForCausalLM", "qwen2_swiftkv"),
        "qwen3": ("Qwen3SwiftKVForCausalLM", "qwen3_swiftkv"),
        "gemma3_text": ("Gemma3SwiftKVForCausalLM", "gemma3_text_swiftkv")}
SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
              "chat_template.jinja", "generation_config.json", "vocab.json", "merges.txt")


def init_swiftkv_tensors(get, num_layers: int, l: int, g: int, bias: bool = False) -> dict[str, torch.Tensor]:
    """Initial SwiftKV tensors from the base weights (``get(name) -> tensor``)."""
    out = {swiftkv_format.NORM_TENSOR: get(f"model.layers.{l}.input_layernorm.weight").clone()}
    sfx = (".weight", ".bias") if bias else (".weight",)
    for i in range(l, num_layers):
        p = f"model.layers.{i}.self_attn."
        for s in sfx:
            out[p + "q_proj_swiftkv" + s] = get(p + "q_proj" + s).clone()
        if (i - l) % g == 0:
            group = range(i, min(i + g, num_layers))
            for n in ("k_proj", "v_proj"):
                for s in sfx:
                    import torch

                    stack = torch.stack([get(f"model.layers.{j}.self_attn.{n}{s}").float() for j in group])
                    out[p + n + "_swiftkv" + s] = stack.mean(0).to(get(p + n + s).dtype)
    return out


def swiftkv_config(base_cfg: dict, l: int, g: int) -> dict:
    model_type = base_cfg.get("model_type", "llama")
    if model_type not in ARCH:
        raise ValueError(f"SwiftKV conversion supports {sorted(ARCH)}, not {model_type!r}")
    L = int(base_cfg["num_hidden_layers"])
    if not 1 <= l < L:
        raise ValueError(f"num_key_value_layers must be in [1, {L - 1}] for a {L}-layer model, got {l}")
    if g < 1 or g > L - l:
        raise ValueError(f"key_value_group_size must be in [1, {L - l}], got {g}")
    arch, mtype = ARCH[model_type]
    cfg = dict(base_cfg)
    cfg.update({"architectures": [arch], "model_type": mtype, **swiftkv_format.config_fields(l, g)})
    from refengine.model_config import ModelConfigError, parse_model_config

    try:
        parse_model_config(cfg)              # what the engine would refuse (e.g. mixed AcrossKV groups)
    except ModelConfigError as exc:
        raise ValueError(str(exc)) from None
    return cfg


def _link_or_copy(src: Path, dst: Path) -> None:
    if dst.exists():
        dst.unlink()
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def write_swiftkv_checkpoint(base_dir: str | Path, out_dir: str | Path, l: int, g: int,
                             tensors: dict[str, torch.Tensor] | None = None) -> Path:
    """Write a SwiftKV checkpoint: base weights (linked) + SwiftKV tensors.

    ``tensors`` defaults to the paper initialisation; pass trained tensors (e.g. from
    distillation) to override any of them.
    """
    from safetensors.torch import save_file

    from refengine.weights import WeightSource

    base_dir, out_dir = Path(base_dir), Path(out_dir)
    base_cfg = json.loads((base_dir / "config.json").read_text())
    if base_cfg.get("swiftkv") or "swiftkv" in base_cfg.get("model_type", ""):
        raise ValueError(f"{base_dir} is already a SwiftKV checkpoint; convert from the plain model")
    cfg = swiftkv_config(base_cfg, l, g)
    L = int(cfg["num_hidden_layers"])
    w = WeightSource(base_dir)
    bias = f"model.layers.{l}.self_attn.q_proj.bias" in w
    init = init_swiftkv_tensors(lambda n: w.get(n), L, l, g, bias)
    if tensors:
        unknown = set(tensors) - set(init)
        if unknown:
            raise ValueError(f"unexpected SwiftKV tensors: {sorted(unknown)[:5]}")
        for k, v in tensors.items():
            if tuple(v.shape) != tuple(init[k].shape):
                raise ValueError(f"{k}: shape {tuple(v.shape)} != expected {tuple(init[k].shape)}")
            init[k] = v.detach().to(init[k].dtype).contiguous()
    out_dir.mkdir(parents=True, exist_ok=True)
    weight_map: dict[str, str] = {}
    base_index = base_dir / "model.safetensors.index.json"
    if base_index.is_file():
        for name, fname in json.loads(base_index.read_text())["weight_map"].items():
            weight_map[name] = fname
    else:
        for f in sorted(base_dir.glob("*.safetensors")):
            from safetensors import safe_open
            with safe_open(str(f), framework="pt") as h:
                for name in h.keys():
                    weight_map[name] = f.name
    for fname in sorted(set(weight_map.values())):
        _link_or_copy(base_dir / fname, out_dir / fname)
    for gguf in base_dir.glob("*.gguf"):        # the base's quantized file: --load-format gguf serves it + these tensors
        _link_or_copy(gguf, out_dir / gguf.name)
    save_file({k: v.contiguous() for k, v in init.items()}, str(out_dir / SWIFTKV_FILE), metadata={"format": "pt"})
    for k in init:
        weight_map[k] = SWIFTKV_FILE
    total = sum((out_dir / f).stat().st_size for f in set(weight_map.values()))
    (out_dir / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2))
    for f in SIDE_FILES:
        if (base_dir / f).is_file():
            shutil.copy2(base_dir / f, out_dir / f)
    return out_dir


def load_swiftkv_tensors(model_dir: str | Path) -> dict[str, torch.Tensor]:
    """The SwiftKV tensors of a checkpoint (any layout: ours or a single-file download)."""
    from refengine.weights import WeightSource

    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    w = WeightSource(model_dir)
    names = [n for n in w.names() if "_swiftkv" in n]
    return {n: w.get(n) for n in names} if cfg.get("swiftkv") is not None else {}
