"""The engine's KV cache built from a ``CacheSpec`` and the KV methods: what a model layer talks to.

A model layer calls its slot with the step's tensors (T = tokens of the step):
  write(slots [T], k [T, kv_heads, head_dim] after RoPE, v [T, v_width])
  attend(q [T, heads, head_dim] after RoPE, batch, scale) -> [T, out_width]
``v_width`` / ``out_width`` and their head order are defined by ``GroupSpec``
(the model's usual layout when every head has the same size). Inside a slot:

- a *QK transform* maps keys and queries to each head part's stored key space
  (identity split by default; ZACK rotates and truncates),
- each ``HeadPart`` has one K store and one V store (codec from the method that
  set it, dense otherwise; V in host memory when the spec says so),
- an *attention op* per part computes ``[T, nq, k_dim] -> [T, nq, v_dim]`` over the
  stores (paged attention by default; methods may wrap or replace it).

Slots shared by several layers (AcrossKV) are one object, allocated once.
"""

from __future__ import annotations

import torch

from refengine import attention
from refengine.kv.spec import CacheSpec, GroupSpec, HeadPart
from refengine.kv.storage import make_store


class PartKV:
    """Stores of one head part. ``gather(blocks)`` is what ``attention.paged_attention`` reads."""

    def __init__(self, part: HeadPart, k_store, v_store):
        self.part = part
        self.k = k_store
        self.v = v_store

    def gather(self, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k.gather(blocks), self.v.gather(blocks.to(self.v.data.device)).to(blocks.device)


def paged_op(q: torch.Tensor, part: PartKV, batch: attention.AttnBatch, scale: float) -> torch.Tensor:
    """Default attention op of a part: ``[T, nq, k_dim] -> [T, nq, v_dim]``."""
    return attention.paged_attention(q, part, batch, scale)


class HeadSplit:
    """The identity QK transform: queries and keys of each part's heads, unchanged."""

    def __init__(self, group: GroupSpec, device: torch.device):
        parts = group.parts
        self.single = len(parts) == 1
        g = group.q_per_kv
        self.k_idx = [torch.tensor(p.heads, device=device) for p in parts]
        self.q_idx = [torch.tensor([h * g + j for h in p.heads for j in range(g)], device=device) for p in parts]

    def keys(self, k: torch.Tensor) -> list[torch.Tensor]:
        return [k] if self.single else [k.index_select(1, i) for i in self.k_idx]

    def queries(self, q: torch.Tensor) -> list[torch.Tensor]:
        return [q] if self.single else [q.index_select(1, i) for i in self.q_idx]


class SlotKV:
    def __init__(self, group: GroupSpec, parts: list[PartKV], ops: list, transform):
        self.group = group
        self.parts = parts
        self.ops = ops
        self.transform = transform
        self.v_splits = [len(p.part.heads) * p.part.v_dim for p in parts]

    @property
    def device_bytes_per_token(self) -> int:
        return sum(p.k.bytes_per_token + (0 if self.group.v_on_host else p.v.bytes_per_token) for p in self.parts)

    @property
    def host_bytes_per_token(self) -> int:
        return sum(p.v.bytes_per_token for p in self.parts) if self.group.v_on_host else 0

    def write(self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        T = k.shape[0]
        vs = v.split(self.v_splits, dim=-1) if len(self.parts) > 1 else (v,)
        for p, kp, vp in zip(self.parts, self.transform.keys(k), vs):
            p.k.write(slots, kp)
            p.v.write(slots.to(p.v.data.device), vp.reshape(T, len(p.part.heads), p.part.v_dim))

    def attend(self, q: torch.Tensor, batch: attention.AttnBatch, scale: float) -> torch.Tensor:
        T = q.shape[0]
        outs = [op(qp, p, batch, scale).reshape(T, -1)
                for p, op, qp in zip(self.parts, self.ops, self.transform.queries(q))]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)


class KVCache:
    """Every slot of the engine; ``layers[i]`` is the ``SlotKV`` layer i reads and writes."""

    def __init__(self, spec: CacheSpec, methods: list, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: torch.device):
        self.spec = spec
        self.methods = list(methods)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.slots = [self._build_slot(g, num_blocks, block_size, dtype, device) for g in spec.groups]
        self.layers = [self.slots[s] for s in spec.layer_slot]

    def _applying(self, group: GroupSpec) -> list:
        return [m for m in self.methods if m.applies_to(group)]

    def _store(self, group: GroupSpec, heads: int, dims: int, num_blocks: int, block_size: int, dtype, device):
        for m in self._applying(group):
            store = m.make_store(group, heads, dims, num_blocks, block_size, dtype, device)
            if store is not None:
                return store
        return make_store(group.codec, num_blocks, block_size, heads, dims, dtype, device)

    def _build_slot(self, group: GroupSpec, num_blocks, block_size, dtype, device) -> SlotKV:
        v_device = torch.device("cpu") if group.v_on_host else device
        parts, ops = [], []
        for part in group.parts:
            n = len(part.heads)
            k = self._store(group, n, part.k_dim, num_blocks, block_size, dtype, device)
            v = self._store(group, n, part.v_dim, num_blocks, block_size, dtype, v_device)
            parts.append(PartKV(part, k, v))
            op = paged_op
            for m in self._applying(group):
                op = m.wrap_attention(group, op)
            ops.append(op)
        transform = None
        for m in self._applying(group):
            transform = transform or m.qk_transform(group, device, dtype)
        return SlotKV(group, parts, ops, transform or HeadSplit(group, device))

    @property
    def bytes_per_token(self) -> int:
        """Device bytes per token (what the block pool is sized by)."""
        return sum(s.device_bytes_per_token for s in self.slots)

    @property
    def host_bytes_per_token(self) -> int:
        return sum(s.host_bytes_per_token for s in self.slots)

    @property
    def bytes_total(self) -> int:
        return self.bytes_per_token * self.num_blocks * self.block_size

    def stats(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for m in self.methods:
            out.update(m.stats())
        return out
