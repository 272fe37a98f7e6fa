"""Paged storage codecs: one tensor of ``num_blocks x block_size`` token slots per K or V.

A store holds ``heads`` heads of ``dims`` elements for every token slot and knows
nothing about attention:
  write(slots [T], x [T, heads, dims])     encode and store T tokens at flat slots
  gather(blocks [n]) -> [n, block_size, heads, dims]   decode whole blocks (compute dtype)
  rows(slots [N]) -> [N, heads, dims]      decode single tokens (top-N recall, eviction)
  move(src [N], dst [N])                   copy token slots (compaction after eviction)
Flat slot index = ``block_id * block_size + offset``. Whole-block ``index_select``
is several times faster on CPU than gathering tokens one by one.

Codecs: ``DenseStore`` (the compute dtype) and ``Fp8Store`` (float8 e4m3 bytes with
one float32 absmax scale per (token, head); stored as uint8 so index ops work on
every backend).
"""

from __future__ import annotations

import torch

from refengine.kv.spec import codec_bytes

FP8_MAX = 448.0  # largest finite float8_e4m3fn value


class DenseStore:
    codec = "dense"

    def __init__(self, num_blocks: int, block_size: int, heads: int, dims: int, dtype: torch.dtype,
                 device: torch.device, pin: bool = False):
        self.data = torch.zeros(num_blocks, block_size, heads, dims, dtype=dtype, device=device,
                                pin_memory=pin)
        self.bytes_per_token = heads * codec_bytes("dense", dims, self.data.element_size())

    def write(self, slots: torch.Tensor, x: torch.Tensor) -> None:
        self.data.view(-1, *self.data.shape[2:]).index_copy_(0, slots, x.to(self.data.dtype))

    def gather(self, blocks: torch.Tensor) -> torch.Tensor:
        return self.data.index_select(0, blocks)

    def rows(self, slots: torch.Tensor) -> torch.Tensor:
        return self.data.view(-1, *self.data.shape[2:]).index_select(0, slots)

    def move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        flat = self.data.view(-1, *self.data.shape[2:])
        flat.index_copy_(0, dst, flat.index_select(0, src))


class Fp8Store:
    """Per-(token, head) absmax scaling into float8_e4m3fn; real 1-byte storage."""

    codec = "fp8"

    def __init__(self, num_blocks: int, block_size: int, heads: int, dims: int, dtype: torch.dtype,
                 device: torch.device, pin: bool = False):
        self.dtype = dtype
        self.data = torch.zeros(num_blocks, block_size, heads, dims, dtype=torch.uint8, device=device,
                                pin_memory=pin)
        self.scale = torch.ones(num_blocks, block_size, heads, 1, dtype=torch.float32, device=device,
                                pin_memory=pin)
        self.bytes_per_token = heads * codec_bytes("fp8", dims, 1)

    @staticmethod
    def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = x.float()
        scale = x.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / FP8_MAX
        return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale

    def _flat(self):
        return self.data.view(-1, *self.data.shape[2:]), self.scale.view(-1, *self.scale.shape[2:])

    def write(self, slots, x):
        q, s = self.quantize(x)
        data, scale = self._flat()
        data.index_copy_(0, slots, q.view(torch.uint8))
        scale.index_copy_(0, slots, s)

    def _decode(self, data: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return (data.view(torch.float8_e4m3fn).float() * scale).to(self.dtype)

    def gather(self, blocks):
        return self._decode(self.data.index_select(0, blocks), self.scale.index_select(0, blocks))

    def rows(self, slots):
        data, scale = self._flat()
        return self._decode(data.index_select(0, slots), scale.index_select(0, slots))

    def move(self, src, dst):
        for flat in self._flat():
            flat.index_copy_(0, dst, flat.index_select(0, src))


STORES = {"dense": DenseStore, "fp8": Fp8Store}


def make_store(codec: str, num_blocks: int, block_size: int, heads: int, dims: int, dtype: torch.dtype,
               device: torch.device, pin: bool = False):
    if codec not in STORES:
        raise ValueError(f"no built-in store for codec {codec!r}")
    return STORES[codec](num_blocks, block_size, heads, dims, dtype, device, pin)
