"""The KV cache interface and its storage implementations.

A model layer never touches cache tensors directly: it calls its ``KVLayerCache``
(``write`` the new K/V of the step's tokens, then ``attend`` with the queries).
KV methods are implementations of this one interface, so they compose with each
other and with SwiftKV instead of forking the model:

- ``DenseKVCache``   K and V in the compute dtype (the baseline).
- ``Fp8KVCache``     K and V as float8 e4m3 (1 byte) with a float32 scale per
                     (token, kv head); dequantised on read.

Cache *slots* are the unit of storage. ``KVCache.layer_slot[i]`` says which slot
layer ``i`` reads; several layers may share one slot (SwiftKV's AcrossKV), and
the shared slot is allocated once, so the bytes per token really shrink. All
slots index the same block ids (one block table per request).

Shapes: storage ``[num_blocks, block_size, kv_heads, head_dim]``. Writes address
tokens by flat slot index ``block_id * block_size + offset``; reads gather whole
blocks (``index_select`` of contiguous blocks is several times faster on CPU than
gathering tokens one by one).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from refengine import attention

FP8_MAX = 448.0  # largest finite float8_e4m3fn value


class KVLayerCache:
    """One cache slot. Subclasses define the storage format; attention is shared."""

    bytes_per_token: int

    def write(self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store K/V ``[T, kv_heads, head_dim]`` of T tokens at flat ``slots [T]``."""
        raise NotImplementedError

    def gather(self, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V of block ids ``blocks [n]`` -> ``[n, block_size, kv_heads, head_dim]`` in the compute dtype."""
        raise NotImplementedError

    def attend(self, q: torch.Tensor, batch: "attention.AttnBatch", scale: float) -> torch.Tensor:
        """Attention of queries ``q [T, heads, head_dim]`` over this slot -> ``[T, heads, head_dim]``."""
        return attention.paged_attention(q, self, batch, scale)


class DenseKVCache(KVLayerCache):
    def __init__(self, num_blocks: int, block_size: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device):
        self.k = torch.zeros(num_blocks, block_size, kv_heads, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.bytes_per_token = 2 * kv_heads * head_dim * self.k.element_size()

    def write(self, slots, k, v):
        self.k.view(-1, *self.k.shape[2:]).index_copy_(0, slots, k.to(self.k.dtype))
        self.v.view(-1, *self.v.shape[2:]).index_copy_(0, slots, v.to(self.v.dtype))

    def gather(self, blocks):
        return self.k.index_select(0, blocks), self.v.index_select(0, blocks)


class Fp8KVCache(KVLayerCache):
    """Per-(token, head) absmax scaling into float8_e4m3fn; real 1-byte storage."""

    def __init__(self, num_blocks: int, block_size: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device):
        self.dtype = dtype
        shape = (num_blocks, block_size, kv_heads)
        # Stored as raw bytes (uint8 views of float8_e4m3fn): index ops work on every backend.
        self.k = torch.zeros(*shape, head_dim, dtype=torch.uint8, device=device)
        self.v = torch.zeros_like(self.k)
        self.k_scale = torch.ones(*shape, 1, dtype=torch.float32, device=device)
        self.v_scale = torch.ones_like(self.k_scale)
        self.bytes_per_token = 2 * kv_heads * (head_dim * 1 + 4)

    @staticmethod
    def _quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = x.float()
        scale = x.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / FP8_MAX
        return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale

    def write(self, slots, k, v):
        for store, scale, x in ((self.k, self.k_scale, k), (self.v, self.v_scale, v)):
            q, s = self._quant(x)
            store.view(-1, *store.shape[2:]).index_copy_(0, slots, q.view(torch.uint8))
            scale.view(-1, *scale.shape[2:]).index_copy_(0, slots, s)

    def gather(self, blocks):
        out = []
        for store, scale in ((self.k, self.k_scale), (self.v, self.v_scale)):
            x = store.index_select(0, blocks).view(torch.float8_e4m3fn).float() * scale.index_select(0, blocks)
            out.append(x.to(self.dtype))
        return out[0], out[1]


CACHE_DTYPES = {"auto": DenseKVCache, "fp8_e4m3": Fp8KVCache, "fp8": Fp8KVCache}


@dataclass
class KVCacheLayout:
    """Which slot each layer uses. Built from the model spec; no tensors."""

    layer_slot: list[int]
    num_slots: int

    @classmethod
    def for_model(cls, num_layers: int, swiftkv_layers: int | None, group_size: int = 1) -> "KVCacheLayout":
        """Layers < l own a slot each; later layers share one slot per group of ``group_size``."""
        l = num_layers if swiftkv_layers is None else swiftkv_layers
        slots = list(range(l)) + [l + (i - l) // group_size for i in range(l, num_layers)]
        return cls(layer_slot=slots, num_slots=(max(slots) + 1) if slots else 0)


class KVCache:
    """All slots of an engine: ``layers[i]`` is the ``KVLayerCache`` layer i reads and writes."""

    def __init__(self, layout: KVCacheLayout, num_blocks: int, block_size: int, kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device, cache_dtype: str = "auto"):
        if cache_dtype not in CACHE_DTYPES:
            raise ValueError(f"kv cache dtype {cache_dtype!r} not in {sorted(CACHE_DTYPES)}")
        impl = CACHE_DTYPES[cache_dtype]
        self.layout = layout
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.slots = [impl(num_blocks, block_size, kv_heads, head_dim, dtype, device) for _ in range(layout.num_slots)]
        self.layers = [self.slots[s] for s in layout.layer_slot]

    @property
    def bytes_per_token(self) -> int:
        return sum(s.bytes_per_token for s in self.slots)

    @property
    def bytes_total(self) -> int:
        return self.bytes_per_token * self.num_blocks * self.block_size

    @staticmethod
    def bytes_per_token_for(layout: KVCacheLayout, kv_heads: int, head_dim: int,
                            dtype: torch.dtype, cache_dtype: str = "auto") -> int:
        """Bytes per token without allocating (used to size the block pool)."""
        if CACHE_DTYPES[cache_dtype] is Fp8KVCache:
            per_slot = 2 * kv_heads * (head_dim + 4)
        else:
            per_slot = 2 * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()
        return per_slot * layout.num_slots
