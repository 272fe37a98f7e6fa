"""ZipCache's packed block layout and its byte arithmetic. No torch.

A block of ``block_size`` tokens is quantised as a unit when it leaves the
full-precision window. Per KV head of ``dims`` channels, one block stores:

- ``n_hi`` *salient* token slots at ``bits_hi`` and ``block_size - n_hi`` slots at
  ``bits_lo``, each slot ``ceil(dims * bits / 8)`` bytes (codes packed little-end
  first within a byte);
- ``slot_of``: 1 byte per token (which slot holds it), when both precisions occur; K and V
  of a head share it (one salient set per token and head), so only K's block counts it;
- K (quantised per channel): the block's per-channel minimum and range
  (``2 * dims`` metadata values);
- V (channel-separable, per token): the per-channel normaliser ``sqrt(max |v|)``
  (``dims`` values) and each token's minimum and range (``2 * block_size`` values).
Metadata is float16 (float32 when ``bits_hi`` is 16: the "16-bit quantisation"
setting that exists to check the machinery losslessly).

Besides the pool, a fixed full-precision *staging* area holds the window and one
step's new tokens (``staging_blocks``); ``reserved_bytes`` is what it allocates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

BITS = (2, 4, 8, 16)


@dataclass(frozen=True)
class ZipLayout:
    bits_hi: int
    bits_lo: int
    n_hi: int                 # salient slots per block and head
    block_size: int

    @property
    def meta_bytes(self) -> int:
        return 4 if self.bits_hi == 16 else 2

    @property
    def mixed(self) -> bool:
        return 0 < self.n_hi < self.block_size

    def slot_bytes(self, dims: int, bits: int) -> int:
        return math.ceil(dims * bits / 8)

    def block_bytes(self, dims: int, block_size: int, which: str) -> int:
        """Bytes of one block of one head (the spec's ``codec_args`` hook)."""
        if block_size != self.block_size:
            raise ValueError(f"ZipCache layout planned for blocks of {self.block_size}, not {block_size}")
        data = (self.n_hi * self.slot_bytes(dims, self.bits_hi)
                + (block_size - self.n_hi) * self.slot_bytes(dims, self.bits_lo))
        slot_map = block_size if self.mixed and which == "k" else 0     # V reads K's (see the docstring)
        meta = (2 * dims if which == "k" else dims + 2 * block_size) * self.meta_bytes
        return data + slot_map + meta

    def bits_per_element(self, dims: int) -> float:
        """Average stored bits per K+V element of one head (data + metadata)."""
        total = self.block_bytes(dims, self.block_size, "k") + self.block_bytes(dims, self.block_size, "v")
        return 8 * total / (2 * dims * self.block_size)


def staging_blocks(window: int, block_size: int, max_num_seqs: int, max_num_batched_tokens: int) -> int:
    """Staging blocks that always suffice: after each step every running sequence keeps at most
    ``ceil(window / bs) + 1`` staged blocks; one step adds at most ``ceil(tokens / bs)`` blocks plus one
    partly filled block per sequence."""
    per_seq = -(-window // block_size) + 2
    return max_num_seqs * per_seq + -(-max_num_batched_tokens // block_size)


def staging_bytes(blocks: int, block_size: int, part_dims: list[tuple[int, int, int]], elem_bytes: int) -> int:
    """Bytes of the staging area: per head part ``(heads, k_dim, v_dim)``, full-precision K and V plus
    a float32 saliency sum per token-head and a float32 probe count per token."""
    per_block = sum(block_size * (h * (kd + vd) * elem_bytes + 4 * h + 4) for h, kd, vd in part_dims)
    return blocks * per_block
