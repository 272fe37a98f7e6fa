"""Quantized weights served natively by the reference engine.

- ``formats``: the GGUF block formats (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K): reference dequantization
  (bit-equal to llama.cpp's) and quantizers, in torch.
- ``qtensor.QTensor``: a matrix kept in its blocks.
- ``gguf_source.GGUFWeights``: a GGUF file as a weight source in HF names (``load_format="gguf"``).
- ``qlinear``: ``GGUFLinear`` / ``GGUFEmbedding`` over the C++ kernels (csrc/quant_gguf.cpp).
- ``int8``: W8A8 (compressed-tensors checkpoints, ``Int8Linear`` over oneDNN's int8 GEMM; the rows'
  quantize and rescale in C++).
- ``plan``: the ``QuantPlan`` a model is built with, and how the decoder loads its weights.

The model runner calls ``open_gguf`` + ``gguf_plan`` for ``EngineConfig.load_format == "gguf"`` and
``open_safetensors`` for "auto" (a W8A8 checkpoint is recognised from its config.json).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from refengine.quant.gguf_source import GGUFWeights, find_gguf
from refengine.quant.plan import QuantPlan

log = logging.getLogger(__name__)


def open_gguf(model_dir: str | Path, spec) -> GGUFWeights:
    """The model directory's GGUF file as the weight source (its safetensors, if any, for the
    tensors the file lacks), checked against the directory's config.json."""
    from refengine.weights import WeightSource

    path = find_gguf(model_dir)
    fallback = WeightSource(model_dir) if any(Path(model_dir).glob("*.safetensors")) else None
    w = GGUFWeights(path, fallback)
    w.check(spec)
    log.info("weights: %s (%s)", path.name, ", ".join(f"{n} x{c}" for n, c in sorted(w.formats_used().items())))
    return w


def gguf_plan(device: torch.device, dtype: torch.dtype) -> QuantPlan:
    """The kernels on CPU when they build (else a warning, and weights dequantized at load)."""
    from refengine.paged_kernel import _resolve

    kernel = _resolve("gguf kernels", "auto", device) if device.type == "cpu" else None
    if kernel is None:
        log.warning("GGUF weights without the C++ kernels (%s): dequantized to %s at load",
                    device.type if device.type != "cpu" else "build failed", dtype)
    return QuantPlan(dtype, "Q8_0", gguf=kernel.module if kernel is not None else None)


def open_safetensors(model_dir: str | Path, device: torch.device, dtype: torch.dtype, fused_ops: str = "auto"):
    """(weight source, plan): the directory's safetensors, and for a compressed-tensors W8A8
    checkpoint the int8 plan (oneDNN's int8 GEMM on CPU; elsewhere dequantized at load); its rows'
    quantize / rescale in the C++ kernels unless ``fused_ops`` is "torch" (no extension to build)."""
    import json

    from refengine.quant.int8 import CompressedTensorsWeights, Int8Kernels, w8a8_scheme
    from refengine.weights import WeightSource

    base = WeightSource(model_dir)
    cfg = Path(model_dir) / "config.json"
    scheme = w8a8_scheme(json.loads(cfg.read_text())) if cfg.is_file() else None
    if scheme is None:
        return base, None
    kernels = None
    if device.type == "cpu":
        try:
            kernels = Int8Kernels(fused=fused_ops != "torch")
        except RuntimeError as exc:
            log.warning("W8A8 checkpoint without int8 kernels (%s): dequantized to %s at load", exc, dtype)
    else:
        log.warning("W8A8 checkpoint on %s: dequantized to %s at load (int8 GEMMs are CPU only here)", device.type, dtype)
    return CompressedTensorsWeights(base), QuantPlan(dtype, "int8", int8=kernels)
