"""Each quantized linear layer of the plugin's model against its checkpoint (run inside vLLM).

(Also for vLLM's online FP8, ``--quantization fp8`` on a bf16 checkpoint: each FP8 layer against
the checkpoint's own weight; its error is the FP8 rounding of weights and activations.)

A W8A8 checkpoint (``modelkit quantize``: compressed-tensors, int8 weights with a float scale per
output channel, int8 activations per token at run time) is loaded by vLLM's own quantized linear
layers; the plugin only says which checkpoint tensors (``X.weight`` and ``X.weight_scale``) go to
which layer and shard (``weights.parameter_for``: q/k/v into ``qkv_proj``, a SwiftKV model's
per-group ``k/v_proj_swiftkv`` into one ``kv_proj_swiftkv``). ``quantized_layer_errors(model)`` checks that
mapping where it matters, at the layer: for every quantized layer it runs vLLM's kernel on random
rows and compares with ``x @ (weight * weight_scale).T`` built from the checkpoint's tensors. The
error of a correct layer is the activations' int8 rounding (~1%); a scale or shard loaded into the
wrong rows shows as tens of percent there, which end-to-end greedy tokens of a model this
sensitive to activation rounding do not (measured: docs/vllm.md). One rank only (``tp == 1``: the
checkpoint's tensors are whole).
"""

from __future__ import annotations

from pathlib import Path

import torch

from swiftserve_vllm.weights import parameter_for

_SHARD_ORDER = {"q": 0, "k": 1, "v": 2}


def _checkpoint(model_dir: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _quantized_online(model, layer: str) -> bool:
    """The layer's weight was quantized by vLLM at load (``--quantization fp8`` on a 16-bit checkpoint)."""
    try:
        w = model.get_submodule(layer).weight
    except AttributeError:
        return False
    return w.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)


def reference_weights(model, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Layer name -> its dequantized weight [out, in] as the checkpoint defines it (shards in order); for
    a layer vLLM quantized itself at load, the checkpoint's own 16-bit weight."""
    parts: dict[str, list[tuple[int, torch.Tensor]]] = {}
    for name, w in tensors.items():
        if not name.endswith(".weight"):
            continue
        target = parameter_for(model, name)
        if target is None:
            continue
        pname, shard = target
        layer = pname.removesuffix(".weight")
        scale = tensors.get(name + "_scale")
        if scale is not None:
            full = w.float() * scale.float()
        elif _quantized_online(model, layer):
            full = w.float()
        else:
            continue
        order = 0 if shard is None else _SHARD_ORDER.get(shard, shard)
        parts.setdefault(layer, []).append((order, full))
    return {layer: torch.cat([w for _, w in sorted(ps, key=lambda p: p[0])]) for layer, ps in parts.items()}


@torch.no_grad()
def quantized_layer_errors(model, rows: int = 4, seed: int = 0) -> dict[str, float]:
    """Layer name -> ||y - x W^T|| / ||x W^T|| on ``rows`` random rows, y from vLLM's quantized layer."""
    ref = reference_weights(model, _checkpoint(model.model.model_dir))
    gen = torch.Generator().manual_seed(seed)
    like = next(p for n, p in model.named_parameters() if "norm" in n)      # the model's dtype and device
    errors = {}
    for layer, w in ref.items():
        mod = model.get_submodule(layer)
        x = torch.randn(rows, w.shape[1], generator=gen).to(like.device, like.dtype)
        y = mod.quant_method.apply(mod, x).float()
        r = x.float() @ w.to(x.device).T
        errors[layer] = float((y - r).norm() / r.norm())
    return errors


def summary(model) -> dict:
    """What ``probe`` records for a quantized checkpoint (``apply_model`` runs it on each rank)."""
    errors = quantized_layer_errors(model)
    worst = max(errors, key=errors.get) if errors else None
    return {"quantized_layers": len(errors), "quantized_max_rel_error": errors.get(worst), "worst_layer": worst}
