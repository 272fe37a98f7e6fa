"""``QTensor``: a weight matrix kept in a GGUF block format (raw bytes as stored, never expanded).

``raw [rows, row_bytes]`` uint8 holds ``rows`` output channels of ``cols`` input values each in
``qtype`` (refengine.quant.formats). Rows are independent, so concatenating matrices along the
output dimension (fused q/k/v, gate/up) and permuting rows (llama.cpp's Q/K rotary order) are
byte copies of whole rows: exact.

``group`` > 1: the rows are interleaved in groups of ``group`` (block i of each row of a group
adjacent, then block i + 1), the same blocks in another order, so that the VNNI kernel reads 4 rows
of Q4_K as one sequential stream (``gguf_gemm(..., group=4)``; ``interleaved`` makes it). ``raw``'s
shape is unchanged; ``rows_raw`` gives the stored order back, and every method here handles both.
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
    group: int = 1               # rows interleaved block by block in groups of this many (1: as stored)

    def __post_init__(self) -> None:
        want = formats.row_bytes(self.qtype, self.cols)
        if self.raw.dtype != torch.uint8 or self.raw.dim() != 2 or self.raw.shape[1] != want:
            raise ValueError(f"{self.qtype} rows of {self.cols} values take {want} bytes; "
                             f"got {self.raw.dtype} {tuple(self.raw.shape)}")
        if self.group < 1 or self.raw.shape[0] % self.group:
            raise ValueError(f"{self.raw.shape[0]} rows do not split into groups of {self.group}")

    def _blocks(self) -> tuple[int, int]:
        fmt = formats.FORMATS[self.qtype]
        return self.cols // fmt.block, fmt.block_bytes

    def interleaved(self, group: int) -> "QTensor":
        """The same blocks with rows interleaved in groups of ``group`` (from the stored order)."""
        if group == self.group:
            return self
        nblk, bb = self._blocks()
        raw = self.rows_raw()
        v = raw.view(raw.shape[0] // group, group, nblk, bb).transpose(1, 2)
        return QTensor(self.qtype, v.contiguous().view(raw.shape), self.cols, group)

    def rows_raw(self) -> torch.Tensor:
        """``raw`` in the stored row order (``raw`` itself when not interleaved, else a copy)."""
        if self.group == 1:
            return self.raw
        nblk, bb = self._blocks()
        n, g = self.raw.shape[0], self.group
        return self.raw.view(n // g, nblk, g, bb).transpose(1, 2).contiguous().view(self.raw.shape)

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
        return formats.dequantize(self.qtype, self.rows_raw(), self.cols).to(dtype)

    def index_rows(self, idx: torch.Tensor) -> "QTensor":
        """Rows ``idx`` in the stored order (an embedding lookup), whatever the grouping."""
        idx = idx.to(self.raw.device)
        if self.group == 1:
            return QTensor(self.qtype, self.raw.index_select(0, idx), self.cols)
        nblk, bb = self._blocks()
        g = self.group
        v = self.raw.view(self.raw.shape[0] // g, nblk, g, bb)
        return QTensor(self.qtype, v[idx // g, :, idx % g].reshape(idx.numel(), nblk * bb), self.cols)

    def to(self, device) -> "QTensor":
        return QTensor(self.qtype, self.raw.to(device), self.cols, self.group)

    @staticmethod
    def quantize(w: torch.Tensor, qtype: str) -> "QTensor":
        return QTensor(qtype, formats.quantize(qtype, w.float().cpu()).to(w.device), w.shape[1])

    @staticmethod
    def cat(parts: list["QTensor"]) -> "QTensor":
        """Rows of several matrices of one format, width and grouping, in order (groups stay whole)."""
        if len({(p.qtype, p.cols, p.group) for p in parts}) != 1:
            raise ValueError("QTensor.cat: parts differ in format, width or row grouping")
        return QTensor(parts[0].qtype, torch.cat([p.raw for p in parts]), parts[0].cols, parts[0].group)
