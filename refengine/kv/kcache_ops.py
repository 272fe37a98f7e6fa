"""KCache's tensor work: the host V store and top-N decode attention.

``HostStore`` wraps a store allocated in CPU memory (pinned when the device is CUDA).
A write from a CUDA tensor is pushed asynchronously: the rows are copied into a
pinned buffer with ``non_blocking=True`` and an event is recorded; the copy lands in
the pool before the next read of the store (``_land``). On CPU a write is a plain
copy into the separate host allocation.

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


class HostStore:
    """A store in host memory; writes from the device land asynchronously (CUDA)."""

    def __init__(self, inner):
        self.inner = inner
        self.device = inner.device
        self.codec = inner.codec
        self.bytes_per_token = inner.bytes_per_token
        self.bytes_per_block = inner.bytes_per_block
        self._pending: list[tuple[torch.Tensor, torch.Tensor, object]] = []

    @property
    def data(self):
        return self.inner.data

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in vars(self.inner).values() if torch.is_tensor(t)]

    def write(self, slots: torch.Tensor, x: torch.Tensor) -> None:
        if x.device.type == "cuda":
            buf = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
            buf.copy_(x, non_blocking=True)                 # device -> pinned host, async
            event = torch.cuda.Event()
            event.record()
            self._pending.append((slots.to("cpu"), buf, event))
            return
        self.inner.write(slots, x)

    def _land(self) -> None:
        for slots, buf, event in self._pending:
            event.synchronize()
            self.inner.write(slots, buf)
        self._pending.clear()

    def gather(self, blocks):
        self._land()
        return self.inner.gather(blocks)

    def rows(self, slots):
        self._land()
        return self.inner.rows(slots)

    def pick(self, slots, heads):
        self._land()
        return self.inner.pick(slots, heads)

    def move(self, src, dst):
        self._land()
        self.inner.move(src, dst)

    def move_heads(self, src, dst):
        self._land()
        self.inner.move_heads(src, dst)


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
