"""How a model with quantized weights builds its layers: ``QuantPlan`` and the two calls the
decoder makes, ``load_linear_weight`` (a weight from the source, kept quantized where it can be)
and ``quant_layer`` (the module for a list of quantized parts).

Two kinds of quantized weight reach the model, each from its own source:
  ``QTensor`` (GGUF blocks: ``load_format="gguf"``, refengine.quant.gguf_source) -> ``GGUFLinear``;
  ``Int8Weight`` (a compressed-tensors W8A8 checkpoint, refengine.quant.int8) -> ``Int8Linear``.
A source offers them through ``get_quant(name)`` (None: not quantized there) and says with
``stored_dense(name)`` which weights it keeps unquantized on purpose (F32 tensors of a GGUF, the
layers a W8A8 checkpoint ignores): those stay dense. A linear weight the source does not have
at all but the model adds (SwiftKV's extra projections absent from the file, weights a KV method
folds at load) is quantized at load to the plan's ``fill`` format (GGUF: Q8_0; W8A8: int8), so a
quantized model stays quantized throughout. Without the kernels for a kind (no C++ build, a GPU,
no oneDNN int8), its weights are dequantized once at load into the model dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from refengine.quant.int8 import Int8Linear, Int8Weight
from refengine.quant.qlinear import GGUFEmbedding, GGUFLinear
from refengine.quant.qtensor import QTensor


@dataclass
class QuantPlan:
    dtype: torch.dtype              # the model's activation dtype
    fill: str                       # "Q8_0" (GGUF models) or "int8" (W8A8 models)
    gguf: object | None = None      # the C++ module (gguf_gemm, act_quant, gguf_dequant)
    int8: object | None = None      # refengine.quant.int8.Int8Kernels

    def runs(self, w) -> bool:
        return (self.gguf is not None) if isinstance(w, QTensor) else (self.int8 is not None)

    def layout(self, q):
        """``q`` in the row order its kernel reads fastest: Q4_K rows interleaved in 4s where the VNNI
        kernel runs (one sequential stream for 4 rows at a token; ~1.2x its rate here, results
        unchanged: docs/models.md), else as stored (every other format, and W8A8's ``Int8Weight``)."""
        if (isinstance(q, QTensor) and q.qtype == "Q4_K" and q.shape[0] % 4 == 0
                and self.gguf is not None and self.gguf.gguf_has_vnni()):
            return q.interleaved(4)
        return q


def load_linear_weight(w, name: str, dtype: torch.dtype, device, plan: QuantPlan | None):
    """A linear layer's weight from source ``w``: dense, or quantized (QTensor / Int8Weight) where the
    plan runs that kind (see the module docstring for which)."""
    if plan is None:
        return w.get(name, dtype, device)
    get_quant = getattr(w, "get_quant", None)
    q = get_quant(name) if get_quant is not None else None
    if q is not None:
        return plan.layout(q) if plan.runs(q) else q.dequantize(dtype).to(device)
    stored_dense = getattr(w, "stored_dense", lambda n: False)(name)
    t = w.get(name, torch.float32, device)
    if not stored_dense and t.dim() == 2:
        if plan.fill == "Q8_0" and plan.gguf is not None and t.shape[1] % 32 == 0:
            return QTensor.quantize(t, "Q8_0")
        if plan.fill == "int8" and plan.int8 is not None:
            return Int8Weight.quantize(t)
    return t.to(dtype)


def quant_layer(parts: list, bias: torch.Tensor | None, plan: QuantPlan | None) -> nn.Module | None:
    """The module for ``parts`` when all are quantized of one kind; None when none is (dense path).
    A mix is served dense by the caller: the quantized parts come back dequantized (``dense_parts``)."""
    if all(isinstance(p, QTensor) for p in parts):
        return GGUFLinear(parts, bias, plan.gguf)
    if all(isinstance(p, Int8Weight) for p in parts):
        return Int8Linear(Int8Weight.cat(parts) if len(parts) > 1 else parts[0], bias, plan.int8)
    return None


def dense_parts(parts: list) -> list[torch.Tensor]:
    dtype = next((p.dtype for p in parts if isinstance(p, torch.Tensor)), torch.float32)
    return [p if isinstance(p, torch.Tensor) else p.dequantize(dtype) for p in parts]


def quant_embedding(weight, plan: QuantPlan):
    """A ``GGUFEmbedding`` for a GGUF-quantized table, else the dense table (a tensor)."""
    if isinstance(weight, QTensor):
        return GGUFEmbedding(weight, plan.gguf, plan.dtype)
    return weight.dequantize(plan.dtype) if isinstance(weight, Int8Weight) else weight
