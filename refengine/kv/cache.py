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

Slots shared by several layers (AcrossKV) are one object, allocated once. Slots of
sliding-window layers form their own *attention group* per window (``windows``,
``layer_group[i]``): the model hands each layer the step's attention batch and slot
mapping of its group, and a group's slots may have a pool of their own size
(``num_blocks`` per group; ``refengine.block_groups``). A slot
whose spec puts V on the host allocates its V stores in CPU memory (pinned when the
device is CUDA), apart from the device pool: the pool's budget counts device bytes
only. Such a store takes indices on the compute device (``on_store``), and the slot of the
layer before it starts its prefill fetch when it attends (``prefetch_next``; a no-op unless
the store is staged, i.e. on CUDA: ``refengine.kv.methods.kcache.ops``). ``compact`` moves kept entries of one request to the front of its block table,
head by head (eviction); RoPE was applied before ``write``, so nothing is re-rotated.
"""

from __future__ import annotations

import torch

from refengine import attention
from refengine.kv.spec import BlockBytes, CacheSpec, GroupSpec, HeadPart
from refengine.kv.storage import DenseStore, make_store


def on_store(store, idx: torch.Tensor) -> torch.Tensor:
    """Indices as ``store`` takes them: on its own device, unless it moves them itself (KCache's host
    store on CUDA: moving them here would make the host wait for the device)."""
    return idx if getattr(store, "accepts_device_index", False) else idx.to(store.device)


class PartKV:
    """Stores of one head part. ``gather(blocks)`` is what ``attention.paged_attention`` reads."""

    def __init__(self, part: HeadPart, k_store, v_store):
        self.part = part
        self.k = k_store
        self.v = v_store

    @property
    def v_device(self) -> torch.device:
        return self.v.device

    def gather(self, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k.gather(blocks), self.v.gather(on_store(self.v, blocks)).to(blocks.device, non_blocking=True)

    def dense_pools(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The K and V pools ``[N, bs, heads, dims]`` when both are plain dense stores on one device
        (what the decode kernel reads in place), else None."""
        if type(self.k) is DenseStore and type(self.v) is DenseStore and self.k.device == self.v.device:
            return self.k.data, self.v.data
        return None


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


class SlotKV(BlockBytes):
    def __init__(self, group: GroupSpec, parts: list[PartKV], ops: list, transform, block_size: int):
        self.group = group
        self.block_size = block_size
        self.parts = parts
        self.ops = ops
        self.transform = transform
        self.v_splits = [len(p.part.heads) * p.part.v_dim for p in parts]
        self.prefetch_next: SlotKV | None = None     # the next layer's V-on-host slot (KVCache sets it)

    @property
    def device_bytes_per_block(self) -> int:
        return sum(p.k.bytes_per_block + (0 if self.group.v_on_host else p.v.bytes_per_block) for p in self.parts)

    @property
    def host_bytes_per_block(self) -> int:
        return sum(p.v.bytes_per_block for p in self.parts) if self.group.v_on_host else 0

    def write(self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        T = k.shape[0]
        vs = v.split(self.v_splits, dim=-1) if len(self.parts) > 1 else (v,)
        for p, kp, vp in zip(self.parts, self.transform.keys(k), vs):
            p.k.write(slots, kp)
            p.v.write(on_store(p.v, slots), vp.reshape(T, len(p.part.heads), p.part.v_dim))

    def compact(self, src: list[torch.Tensor], dst: torch.Tensor) -> None:
        """Per part, head h of flat slot ``dst[j]`` <- head h of ``src[part][h, j]`` (K and V)."""
        for p, s in zip(self.parts, src):
            p.k.move_heads(s, dst)
            p.v.move_heads(on_store(p.v, s), on_store(p.v, dst))

    def prefetch(self, batch: attention.AttnBatch) -> None:
        """Let host V stores start fetching this step's prefill blocks (they ignore it unless staged)."""
        seqs = [(p.blocks, p.block_ids) for p in batch.prefills]
        for p in self.parts if seqs else ():
            if hasattr(p.v, "prefetch"):
                p.v.prefetch(seqs)

    def attend(self, q: torch.Tensor, batch: attention.AttnBatch, scale: float) -> torch.Tensor:
        if self.prefetch_next is not None:                   # overlaps this layer's compute (CUDA)
            self.prefetch_next.prefetch(batch)
        T = q.shape[0]
        outs = [op(qp, p, batch, scale).reshape(T, -1)
                for p, op, qp in zip(self.parts, self.ops, self.transform.queries(q))]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)


class KVCache(BlockBytes):
    """Every slot of the engine; ``layers[i]`` is the ``SlotKV`` layer i reads and writes.

    ``num_blocks``: one count for every slot, or one per attention group (``windows`` order).
    ``attention_op``: the engine's attention backend's paged op (``AttentionBackend.paged``)."""

    def __init__(self, spec: CacheSpec, methods: list, num_blocks: int | list[int], block_size: int,
                 dtype: torch.dtype, device: torch.device, attention_op=paged_op):
        self.spec = spec
        self.attention_op = attention_op        # every part's op before KV methods wrap it (the backend's)
        self.methods = list(methods)
        self.windows = spec.windows
        self.group_blocks = list(num_blocks) if isinstance(num_blocks, (list, tuple)) else \
            [num_blocks] * len(self.windows)
        self.num_blocks = max(self.group_blocks) if self.group_blocks else 0
        self.block_size = block_size
        self.device = device
        self.slots = [self._build_slot(g, self.group_blocks[self.windows.index(g.window)], block_size, dtype, device)
                      for g in spec.groups]
        self.layers = [self.slots[s] for s in spec.layer_slot]
        self.layer_group = [self.windows.index(spec.groups[s].window) for s in spec.layer_slot]
        # Each layer's slot names the next layer's slot when that one keeps V on the host: attending,
        # it starts that slot's prefill V fetch (KCache; a slot shared by layers points past itself).
        for cur, nxt in zip(self.layers, self.layers[1:]):
            if nxt is not cur and nxt.group.v_on_host:
                cur.prefetch_next = nxt

    def _applying(self, group: GroupSpec) -> list:
        return [m for m in self.methods if m.applies_to(group)]

    def _store(self, group: GroupSpec, which: str, heads: int, dims: int, num_blocks: int, block_size: int,
               dtype, device, pin: bool = False):
        for m in self._applying(group):
            store = m.make_store(group, which, heads, dims, num_blocks, block_size, dtype, device, pin)
            if store is not None:
                return store
        return make_store(group.codec, num_blocks, block_size, heads, dims, dtype, device, pin)

    def _build_slot(self, group: GroupSpec, num_blocks, block_size, dtype, device) -> SlotKV:
        host = group.v_on_host and torch.device(device).type != "cpu"
        v_device = torch.device("cpu") if group.v_on_host else device
        parts, ops = [], []
        for part in group.parts:
            n = len(part.heads)
            k = self._store(group, "k", n, part.k_dim, num_blocks, block_size, dtype, device)
            v = self._store(group, "v", n, part.v_dim, num_blocks, block_size, dtype, v_device, pin=host)
            parts.append(PartKV(part, k, v))
            op = self.attention_op
            for m in self._applying(group):
                op = m.wrap_attention(group, op)
            ops.append(op)
        transform = None
        for m in self._applying(group):
            transform = transform or m.qk_transform(group, device, dtype)
        return SlotKV(group, parts, ops, transform or HeadSplit(group, device), block_size)

    @property
    def device_bytes_per_block(self) -> int:
        """Device bytes per block (what the block pool is sized by)."""
        return sum(s.device_bytes_per_block for s in self.slots)

    @property
    def host_bytes_per_block(self) -> int:
        return sum(s.host_bytes_per_block for s in self.slots)

    bytes_per_block = device_bytes_per_block            # short names the engine reports with
    bytes_per_token = BlockBytes.device_bytes_per_token

    def _total(self, per_block) -> int:
        return sum(per_block(s) * self.group_blocks[self.windows.index(s.group.window)] for s in self.slots)

    @property
    def bytes_total(self) -> int:
        return self._total(lambda s: s.device_bytes_per_block)

    @property
    def host_bytes_total(self) -> int:
        return self._total(lambda s: s.host_bytes_per_block)

    def compact(self, table: list[int], keep: list[list[torch.Tensor]]) -> None:
        """Move one request's kept entries to the front of its block table, in every slot.

        ``keep[slot][part]`` is ``[heads of the part, N]`` cache indices (ascending per head,
        so ``keep[h, j] >= j``); afterwards entry j of head h holds what ``keep[h, j]`` held.
        """
        bs = self.block_size
        t = torch.tensor(table, dtype=torch.long, device=self.device)
        for slot, parts in zip(self.slots, keep):
            n = parts[0].shape[1]
            dst_idx = torch.arange(n, device=self.device)
            dst = t[dst_idx // bs] * bs + dst_idx % bs
            slot.compact([t[k // bs] * bs + k % bs for k in parts], dst)

    def stats(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for m in self.methods:
            out.update(m.stats())
        return out
