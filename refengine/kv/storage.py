"""Paged storage codecs: one tensor of ``num_blocks x block_size`` token slots per K or V.

A store holds ``heads`` heads of ``dims`` elements for every token slot and knows
nothing about attention:
  write(slots [T], x [T, heads, dims])     encode and store T tokens at flat slots
  gather(blocks [n]) -> [n, block_size, heads, dims]   decode whole blocks (compute dtype)
  rows(slots [N]) -> [N, heads, dims]      decode single tokens
  pick(slots [M], heads [M]) -> [M, dims]  decode one head of single tokens (KCache's top-N fetch)
  move(src [N], dst [N])                   copy token slots
  move_heads(src [heads, N], dst [N])      per-head compaction after eviction: head h of slot
                                           ``dst[j]`` takes head h of slot ``src[h, j]``
Flat slot index = ``block_id * block_size + offset``. Whole-block ``index_select``
is several times faster on CPU than gathering tokens one by one. ``bytes_per_block``
is what one block of the store allocates (the spec's arithmetic checks against it).

Codecs: ``DenseStore`` (the compute dtype) and ``Fp8Store`` (float8 e4m3 bytes with
one float32 absmax scale per (token, head); stored as uint8 so index ops work on
every backend).
"""

from __future__ import annotations

import torch

from refengine.kv.spec import codec_bytes

FP8_MAX = 448.0  # largest finite float8_e4m3fn value


def move_heads(t: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
    """In ``t [blocks, block_size, heads, ...]``: head h of flat slot ``dst[j]`` <- head h of ``src[h, j]``.

    All sources are read before anything is written, so overlapping ranges are safe."""
    flat = t.view(-1, *t.shape[2:])
    heads = torch.arange(src.shape[0], device=src.device)
    flat[dst.unsqueeze(0), heads.unsqueeze(1)] = flat[src, heads.unsqueeze(1)]


class DenseStore:
    codec = "dense"

    def __init__(self, num_blocks: int, block_size: int, heads: int, dims: int, dtype: torch.dtype,
                 device: torch.device, pin: bool = False):
        self.data = torch.zeros(num_blocks, block_size, heads, dims, dtype=dtype, device=device,
                                pin_memory=pin)
        self.device = self.data.device
        self.bytes_per_token = heads * codec_bytes("dense", dims, self.data.element_size())
        self.bytes_per_block = self.bytes_per_token * block_size

    def write(self, slots: torch.Tensor, x: torch.Tensor) -> None:
        self.data.view(-1, *self.data.shape[2:]).index_copy_(0, slots, x.to(self.data.dtype))

    def gather(self, blocks: torch.Tensor) -> torch.Tensor:
        return self.data.index_select(0, blocks)

    def rows(self, slots: torch.Tensor) -> torch.Tensor:
        return self.data.view(-1, *self.data.shape[2:]).index_select(0, slots)

    def pick(self, slots: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
        return self.data.view(-1, *self.data.shape[2:])[slots, heads]

    def move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        flat = self.data.view(-1, *self.data.shape[2:])
        flat.index_copy_(0, dst, flat.index_select(0, src))

    def move_heads(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        move_heads(self.data, src, dst)


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
        self.device = self.data.device
        self.bytes_per_token = heads * codec_bytes("fp8", dims, 1)
        self.bytes_per_block = self.bytes_per_token * block_size

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

    def pick(self, slots, heads):
        data, scale = self._flat()
        return self._decode(data[slots, heads], scale[slots, heads])

    def move(self, src, dst):
        for flat in self._flat():
            flat.index_copy_(0, dst, flat.index_select(0, src))

    def move_heads(self, src, dst):
        move_heads(self.data, src, dst)
        move_heads(self.scale, src, dst)


STORES = {"dense": DenseStore, "fp8": Fp8Store}


def make_store(codec: str, num_blocks: int, block_size: int, heads: int, dims: int, dtype: torch.dtype,
               device: torch.device, pin: bool = False):
    if codec not in STORES:
        raise ValueError(f"no built-in store for codec {codec!r}")
    return STORES[codec](num_blocks, block_size, heads, dims, dtype, device, pin)
