"""KCache's tensor work: the host V store and top-N decode attention.

``HostStore`` wraps a store allocated in CPU memory (pinned when the device is CUDA). It takes
slot and block indices on the compute device (``accepts_device_index``) and moves what it needs.

- Unstaged (a CPU engine): writes are plain copies into the separate host allocation; reads
  return host tensors.
- Staged (a CUDA engine; CPU tests set ``staged = True`` to run the same bookkeeping with
  synchronous copies, ``refengine.kv.methods.kcache.staging``):
  * a write copies the rows and their slot ids device -> host into one of two reusable staging
    buffers (``writes``, a ``StagingRing``: no allocation per write) on a side stream, and lands
    them in the pool later: at the next read, or when its buffer comes round again;
  * ``prefetch(seqs)``, called by the previous layer's slot when it starts attending
    (``SlotKV.prefetch_next``), gathers each prefill sequence's V blocks from the pool into a
    staging buffer of ``fetches`` and starts their host -> device copy, so the copy runs while
    the previous layer computes. The rows this layer then writes (its chunk's V) are kept as
    device tensors (``_fresh``) and patched into the prefetched blocks when ``gather`` takes
    them, so the prefill never waits on its own write's round trip through the host;
  * a gather that was not prefetched, and every decode ``pick``, land the pending writes first.
  Whether the copies overlap on a GPU is untested (no GPU was available; docs/kv-methods.md).

``TopNAttention`` (one per head part of a V-on-host slot), shapes for a decode group
of B sequences, L = max cached tokens (padded to blocks), kvh KV heads of the part,
G query heads per KV head, N = min(top_n, L):
  K [B, L, kvh, dk] (device)  ->  p = softmax(q K^T * scale) [B, kvh, G, L]
  top-N per query head: p_N, idx [B, kvh, G, N]  ->  flat slots via the block table
  V rows fetched from the host: [B, kvh, G, N, dv]  ->  out [B, kvh*G, dv]
Prefill sequences go to the wrapped op unchanged (full attention).
"""

from __future__ import annotations

import torch

from refengine.attention import AttnBatch
from refengine.kv.methods.kcache.staging import Copier, StagingRing
from refengine.kv.storage import DenseStore


class HostStore:
    """A store in host memory; staged: writes land through reusable buffers, prefills prefetched."""

    accepts_device_index = True

    def __init__(self, inner, compute_device: torch.device | str = "cpu"):
        self.inner = inner
        self.device = inner.device
        self.codec = inner.codec
        self.bytes_per_token = inner.bytes_per_token
        self.bytes_per_block = inner.bytes_per_block
        self.compute = torch.device(compute_device)
        self.staged = self.compute.type == "cuda"
        self.copier = Copier(self.compute)
        self.writes = StagingRing(2, pin=self.staged)      # device -> host rows (+ their slot ids)
        self.fetches = StagingRing(2, pin=self.staged)     # host -> device prefetched blocks
        self._prefetched: dict[int, tuple[torch.Tensor, torch.Tensor, object]] = {}  # id(blocks) -> (blocks, out, event)
        self._fresh: list[tuple[torch.Tensor, torch.Tensor]] = []   # (slots, rows) written since the prefetch
        self.prefetches = self.prefetched_blocks = self.prefetch_hits = 0     # counts (tests)

    @property
    def data(self):
        return self.inner.data

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in vars(self.inner).values() if torch.is_tensor(t)]

    def write(self, slots: torch.Tensor, x: torch.Tensor) -> None:
        if not self.staged:
            self.inner.write(slots.to(self.device), x.to(self.device))
            return
        i, (buf, ids) = self.writes.acquire((x.shape, x.dtype), (slots.shape, slots.dtype))
        self.copier.to_host(buf, x)
        event = self.copier.to_host(ids, slots)            # same stream, after buf: covers both
        self.writes.hold(i, lambda: (self.copier.sync(event), self.inner.write(ids, buf)))
        if self._prefetched:
            self._fresh.append((slots, x))

    def _land(self) -> None:
        self.writes.release_all()

    def prefetch(self, seqs: list[tuple[torch.Tensor, tuple[int, ...]]]) -> None:
        """Start fetching the V blocks of prefill sequences ``(blocks, block ids)`` to the device."""
        if not self.staged or type(self.inner) is not DenseStore:
            return
        self._land()                                       # the pool is current up to this layer's write
        self._prefetched.clear()
        self._fresh.clear()
        data = self.inner.data                             # [N, bs, heads, dv]
        for blocks, ids in seqs:
            n = len(ids) * data.shape[1]
            i, (buf,) = self.fetches.acquire(((len(ids), *data.shape[1:]), data.dtype))
            torch.index_select(data, 0, torch.tensor(ids, dtype=torch.long), out=buf)
            out = torch.empty((n + 1, *data.shape[2:]), dtype=data.dtype, device=self.compute)   # + a spare row
            event = self.copier.to_device(buf, out[:n].view(buf.shape))
            self.fetches.hold(i, lambda event=event: self.copier.sync(event))
            self._prefetched[id(blocks)] = (blocks, out, event)
            self.prefetches += 1
            self.prefetched_blocks += len(ids)

    def _patch(self, out: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
        """Prefetched ``out [nblk*bs + 1, heads, dv]`` with the rows written since, as ``[nblk, bs, heads, dv]``.
        Rows of other sequences go to the spare last row (no host sync: no boolean indexing)."""
        bs, n = self.inner.data.shape[1], out.shape[0] - 1
        for slots, x in self._fresh:
            match = (slots // bs).unsqueeze(1) == blocks.unsqueeze(0)          # [T, nblk]
            row = match.int().argmax(1) * bs + slots % bs
            out.index_copy_(0, torch.where(match.any(1), row, torch.full_like(row, n)), x.to(out.dtype))
        return out[:n].view(-1, bs, *out.shape[1:])

    def gather(self, blocks):
        hit = self._prefetched.get(id(blocks)) if self.staged else None
        if hit is not None and hit[0] is blocks:
            self.prefetch_hits += 1
            self.copier.wait(hit[2])
            return self._patch(hit[1], blocks)
        self._land()
        return self.inner.gather(blocks.to(self.device)).to(blocks.device, non_blocking=True)

    def rows(self, slots):
        self._land()
        return self.inner.rows(slots.to(self.device))

    def pick(self, slots, heads):
        self._land()
        return self.inner.pick(slots.to(self.device), heads.to(self.device))

    def _edit(self) -> None:
        self._land()
        self._prefetched.clear()                           # a snapshot taken before a move is stale
        self._fresh.clear()

    def move(self, src, dst):
        self._edit()
        self.inner.move(src.to(self.device), dst.to(self.device))

    def move_heads(self, src, dst):
        self._edit()
        self.inner.move_heads(src.to(self.device), dst.to(self.device))


class TopNAttention:
    """Full-softmax scores on the device, top-N per query head, V rows fetched from the host."""

    def __init__(self, inner, top_n: int, renormalize: bool, counters: dict):
        self.inner = inner
        self.top_n = top_n
        self.renormalize = renormalize
        self.counters = counters

    def __call__(self, q: torch.Tensor, part, batch: AttnBatch, scale: float) -> torch.Tensor:
        out = None
        if batch.prefills:
            out = self.inner(q, part, AttnBatch(batch.prefills, None, batch.num_tokens), scale)
        d = batch.decode
        if d is None:
            return out
        B, maxblk = d.blocks.shape
        k = part.k.gather(d.blocks.reshape(-1))                           # [B*maxblk, bs, kvh, dk]
        bs, kvh = k.shape[1], k.shape[2]
        k = k.view(B, maxblk * bs, kvh, k.shape[-1])                       # [B, L, kvh, dk]
        G = q.shape[1] // kvh
        qd = q[d.q_rows].view(B, kvh, G, q.shape[-1])
        s = torch.einsum("bhgd,blhd->bhgl", qd.float(), k.float()) * scale
        if d.mask is not None:
            s = s.masked_fill(~d.mask.view(B, 1, 1, -1), float("-inf"))
        p = s.softmax(-1)
        n = min(self.top_n, s.shape[-1])
        pn, idx = p.topk(n, dim=-1, sorted=False)                           # [B, kvh, G, N]
        if self.renormalize:
            pn = pn / pn.sum(-1, keepdim=True)
        slots = d.blocks.gather(1, (idx // bs).view(B, -1)).view_as(idx) * bs + idx % bs
        heads = torch.arange(kvh, device=idx.device).view(1, kvh, 1, 1).expand_as(idx)
        vdev = part.v.device
        v = part.v.pick(slots.reshape(-1).to(vdev), heads.reshape(-1).to(vdev))   # [B*kvh*G*N, dv] host
        v = v.to(q.device, non_blocking=True).view(B, kvh, G, n, -1)
        o = torch.einsum("bhgn,bhgnd->bhgd", pn, v.float()).to(q.dtype)    # [B, kvh, G, dv]
        if out is None:
            out = q.new_empty(q.shape[0], q.shape[1], o.shape[-1])
        out[d.q_rows] = o.reshape(B, kvh * G, -1)
        self.counters["kcache_v_rows_fetched"] += float(idx.numel())
        self.counters["kcache_decode_rows"] += float(B)
        return out
