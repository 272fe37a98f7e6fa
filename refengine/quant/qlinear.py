"""Linear layers and embeddings over GGUF-quantized weights (``QTensor``), run by the C++ kernels.

``GGUFLinear(parts, bias, kernels)``: ``forward(x [..., in]) -> [..., out]`` with the weight the
row-concatenation of ``parts`` (fused q/k/v or gate/up whose parts may be stored in different
formats, as a Q4_K_M file stores v in Q6_K and q, k in Q4_K). Each call is one ``gguf_linear``:
it quantizes the rows of ``x`` once (int8 per 32 values, ``act_quant``) and runs one integer-dot
GEMM per run of parts in one format, each writing its columns of one output (csrc/quant_gguf.cpp).
Float32 or bfloat16 in and out (other dtypes go through float32).

``GGUFEmbedding(weight, kernels, dtype)``: rows of a quantized embedding, dequantized on lookup
(the tied LM head runs on the same bytes, never a second copy).
"""

from __future__ import annotations

import torch
from torch import nn

from refengine.paged_kernel import named
from refengine.quant.qtensor import QTensor

KERNEL_DTYPES = (torch.float32, torch.bfloat16)


def _runs(parts: list[QTensor]) -> list[QTensor]:
    """Consecutive parts of one format merged (one GEMM call each); a lone part keeps its storage."""
    runs: list[list[QTensor]] = []
    for p in parts:
        if runs and (runs[-1][0].qtype, runs[-1][0].group) == (p.qtype, p.group):
            runs[-1].append(p)
        else:
            runs.append([p])
    return [r[0] if len(r) == 1 else QTensor.cat(r) for r in runs]


class GGUFLinear(nn.Module):
    def __init__(self, parts: list[QTensor], bias: torch.Tensor | None, kernels) -> None:
        super().__init__()
        if len({p.cols for p in parts}) != 1:
            raise ValueError("GGUFLinear: parts of different input widths")
        self.k = kernels
        self.in_features = parts[0].cols
        self.runs = _runs(parts)
        self.out_features = sum(r.shape[0] for r in self.runs)
        for i, r in enumerate(self.runs):            # buffers: counted and moved with the module
            self.register_buffer(f"raw{i}", r.raw, persistent=False)
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None
        self.formats = [r.qtype for r in self.runs]
        # gguf_gemm's AVX-512 VNNI kernel (Q4_0 / Q4_1 / Q4_K / Q6_K; Q5_0, Q8_0 run the AVX2 code) where the
        # CPU has it; interleaved rows (QTensor.group, the plan's choice) only run there
        self.impl = 2 if kernels.gguf_has_vnni() else 0
        if self.impl != 2 and any(r.group != 1 for r in self.runs):
            raise ValueError("GGUFLinear: rows interleaved for the VNNI kernel on a CPU without it")
        # what gguf_linear takes, once (each run's rows, format and grouping)
        self._call = ([r.raw for r in self.runs], [r.ggml_type for r in self.runs], [r.group for r in self.runs])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        if x2.dtype not in KERNEL_DTYPES:
            x2 = x2.float()
        with named("swiftserve::gguf_gemm"):
            out = self.k.gguf_linear(x2, *self._call, self.impl)
        if self.bias is not None:
            out += self.bias.to(out.dtype)
        out = out.view(*lead, self.out_features)
        return out if out.dtype == x.dtype else out.to(x.dtype)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, formats={'+'.join(self.formats)}"


class GGUFEmbedding(nn.Module):
    def __init__(self, weight: QTensor, kernels, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = weight
        self.register_buffer("raw", weight.raw, persistent=False)
        self.k, self.dtype = kernels, dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.weight.index_rows(ids.reshape(-1)).raw
        with named("swiftserve::gguf_embedding"):
            x = self.k.gguf_dequant(rows, self.weight.ggml_type, self.weight.cols)
        return x.to(self.dtype).view(*ids.shape, self.weight.cols)


