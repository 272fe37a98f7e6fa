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

Shapes: flat storage ``[num_blocks * block_size, kv_heads, head_dim]``; a slot
index is ``block_id * block_size + offset``.
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

    def gather(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V at flat indices ``idx [...]`` -> ``[..., kv_heads, head_dim]`` in the compute dtype."""
        raise NotImplementedError

    def attend(self, q: torch.Tensor, batch: "attention.AttnBatch", scale: float) -> torch.Tensor:
        """Attention of queries ``q [T, heads, head_dim]`` over this slot -> ``[T, heads, head_dim]``."""
        return attention.paged_attention(q, self, batch, scale)


class DenseKVCache(KVLayerCache):
    def __init__(self, num_slots: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device):
        self.k = torch.zeros(num_slots, kv_heads, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros(num_slots, kv_heads, head_dim, dtype=dtype, device=device)
        self.bytes_per_token = 2 * kv_heads * head_dim * self.k.element_size()

    def write(self, slots, k, v):
        self.k.index_copy_(0, slots, k.to(self.k.dtype))
        self.v.index_copy_(0, slots, v.to(self.v.dtype))

    def gather(self, idx):
        return self.k[idx], self.v[idx]


class Fp8KVCache(KVLayerCache):
    """Per-(token, head) absmax scaling into float8_e4m3fn; real 1-byte storage."""

    def __init__(self, num_slots: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device):
        self.dtype = dtype
        f8 = torch.float8_e4m3fn
        self.k = torch.zeros(num_slots, kv_heads, head_dim, dtype=f8, device=device)
        self.v = torch.zeros(num_slots, kv_heads, head_dim, dtype=f8, device=device)
        self.k_scale = torch.ones(num_slots, kv_heads, 1, dtype=torch.float32, device=device)
        self.v_scale = torch.ones(num_slots, kv_heads, 1, dtype=torch.float32, device=device)
        self.bytes_per_token = 2 * kv_heads * (head_dim * 1 + 4)

    @staticmethod
    def _quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = x.float()
        scale = x.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / FP8_MAX
        return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale

    def write(self, slots, k, v):
        kq, ks = self._quant(k)
        vq, vs = self._quant(v)
        # index_copy_ is not implemented for float8 on every backend: copy through a uint8 view.
        self.k.view(torch.uint8).index_copy_(0, slots, kq.view(torch.uint8))
        self.v.view(torch.uint8).index_copy_(0, slots, vq.view(torch.uint8))
        self.k_scale.index_copy_(0, slots, ks)
        self.v_scale.index_copy_(0, slots, vs)

    def gather(self, idx):
        k = self.k.view(torch.uint8)[idx].view(torch.float8_e4m3fn).float() * self.k_scale[idx]
        v = self.v.view(torch.uint8)[idx].view(torch.float8_e4m3fn).float() * self.v_scale[idx]
        return k.to(self.dtype), v.to(self.dtype)


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
        n = num_blocks * block_size
        self.layout = layout
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.slots = [impl(n, kv_heads, head_dim, dtype, device) for _ in range(layout.num_slots)]
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
