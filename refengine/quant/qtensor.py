"""``QTensor``: a weight matrix kept in a GGUF block format (raw bytes as stored, never expanded).

``raw [rows, row_bytes]`` uint8 holds ``rows`` output channels of ``cols`` input values each in
``qtype`` (refengine.quant.formats). Rows are independent, so concatenating matrices along the
output dimension (fused q/k/v, gate/up) and permuting rows (llama.cpp's Q/K rotary order) are
byte copies of whole rows: exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from refengine.quant import formats


@dataclass
class QTensor:
    qtype: str
    raw: torch.Tensor            # uint8 [rows, row_bytes]
    cols: int

    def __post_init__(self) -> None:
        want = formats.row_bytes(self.qtype, self.cols)
        if self.raw.dtype != torch.uint8 or self.raw.dim() != 2 or self.raw.shape[1] != want:
            raise ValueError(f"{self.qtype} rows of {self.cols} values take {want} bytes; "
                             f"got {self.raw.dtype} {tuple(self.raw.shape)}")

    @property
    def shape(self) -> tuple[int, int]:
        return (self.raw.shape[0], self.cols)

    @property
    def ggml_type(self) -> int:
        return formats.FORMATS[self.qtype].ggml_type

    @property
    def nbytes(self) -> int:
        return self.raw.numel()

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """[rows, cols] in ``dtype``: the float32 values of llama.cpp's reference dequantization, cast."""
        return formats.dequantize(self.qtype, self.raw, self.cols).to(dtype)

    def index_rows(self, idx: torch.Tensor) -> "QTensor":
        return QTensor(self.qtype, self.raw.index_select(0, idx.to(self.raw.device)), self.cols)

    def to(self, device) -> "QTensor":
        return QTensor(self.qtype, self.raw.to(device), self.cols)

    @staticmethod
    def quantize(w: torch.Tensor, qtype: str) -> "QTensor":
        return QTensor(qtype, formats.quantize(qtype, w.float().cpu()).to(w.device), w.shape[1])

    @staticmethod
    def cat(parts: list["QTensor"]) -> "QTensor":
        """Rows of several matrices of one format and width, in order."""
        if len({(p.qtype, p.cols) for p in parts}) != 1:
            raise ValueError("QTensor.cat: parts differ in format or width")
        return QTensor(parts[0].qtype, torch.cat([p.raw for p in parts]), parts[0].cols)
