"""ZipCache attention over packed blocks, and the saliency it gathers for staged tokens.

Saliency (ZipCache's normalised attention score): for a staged token t, the sum of the
attention probabilities probe queries give it, divided by how many probes can see it
(causal: a query at cache index i sees t <= i). Per KV head, the probabilities of its
query heads are averaged. Sums and counts accumulate in the K store's ``sal`` / ``cnt``
at the token's staging entry until the block is flushed.

- Prefill sequences (several queries): attention is SDPA (the fused kernel) over the
  dequantised blocks; saliency comes from a few *probe* queries only, the chunk's last
  ``probe_ratio/2`` rows and as many random ones (at least the last row), scored
  against the same keys, so the main attention never forms a score matrix.
- Decode (one query per sequence): the dequantisation is folded into the products.
  With u the unpacked codes in [0, 1] (B sequences, k blocks of t tokens, h heads,
  g query heads per head, c channels):
    s[b,h,g,k,t] = sum_c (q[b,h,g,c] * crange[b,k,h,c]) u_K[b,k,t,h,c] + sum_c q[b,h,g,c] cmin[b,k,h,c]
    o[b,h,g,c]   = sum_k cnorm[b,k,h,c] (sum_t p[b,h,g,k,t] trange[b,k,t,h] u_V[b,k,t,h,c]
                                         + sum_t p[b,h,g,k,t] tmin[b,k,t,h])
  so no dequantised K or V is formed (a GPU kernel would unpack u in registers); the
  softmax row p is explicit, so every decode query is a probe for free.
"""

from __future__ import annotations

import torch

from refengine.attention import AttnBatch, _sdpa


def _accumulate(kstore, blocks: torch.Tensor, probs: torch.Tensor, counts: torch.Tensor) -> None:
    """Add ``probs [nblk, bs, n]`` and ``counts [nblk, bs]`` to the staging entries of staged ``blocks``."""
    st = kstore.state.stage_of[blocks]
    staged = st >= 0
    if bool(staged.any()):
        kstore.sal.index_add_(0, st[staged], probs[staged])
        kstore.cnt.index_add_(0, st[staged], counts[staged])


def probe_rows(n: int, ratio: float, gen: torch.Generator) -> torch.Tensor:
    """Probe rows of an n-query chunk: the last ceil(ratio/2 * n) (at least 1) and as many random others."""
    recent = max(1, -(-int(ratio * n) // 2))
    rows = list(range(max(0, n - recent), n))
    rest = n - len(rows)
    if rest > 0:
        pick = torch.randperm(rest, generator=gen)[:min(rest, recent)]
        rows += sorted(int(i) for i in pick)
    return torch.tensor(sorted(rows), dtype=torch.long)


class ZipAttention:
    def __init__(self, probe_ratio: float, counters: dict):
        self.probe_ratio = probe_ratio
        self.counters = counters
        self.gen = torch.Generator().manual_seed(0)

    def __call__(self, q: torch.Tensor, part, batch: AttnBatch, scale: float) -> torch.Tensor:
        out = None
        for p in batch.prefills:
            o = self._prefill(q, part, p, scale)
            if out is None:
                out = q.new_empty(q.shape[0], q.shape[1], o.shape[-1])
            out[p.q_start:p.q_end] = o
        if batch.decode is not None:
            o = self._decode(q, part, batch.decode, scale)
            if out is None:
                out = q.new_empty(q.shape[0], q.shape[1], o.shape[-1])
            out[batch.decode.q_rows] = o
        return out

    def _prefill(self, q, part, p, scale):
        k = part.k.gather(p.blocks)                                   # [nblk, bs, n, dk]
        nblk, bs, kvh = k.shape[:3]
        k = k.flatten(0, 1)[:p.ctx]
        v = part.v.gather(p.blocks).flatten(0, 1)[:p.ctx]
        qi = q[p.q_start:p.q_end]
        o = _sdpa(qi.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0),
                  p.mask, p.mask is None, scale)[0].transpose(0, 1)   # [n, nq, dv]
        # probes: their attention over the whole context, columns summed per KV head
        n = qi.shape[0]
        rows = probe_rows(n, self.probe_ratio, self.gen).to(q.device)
        idx = p.ctx - n + rows                                        # cache index of each probe
        qp = qi[rows].float().view(len(rows), kvh, -1, qi.shape[-1])
        s = torch.einsum("phgd,thd->hgpt", qp, k.float()) * scale
        pos = torch.arange(p.ctx, device=q.device)
        sees = pos.view(1, -1) <= idx.view(-1, 1)                     # [np, ctx]
        a = s.masked_fill(~sees, float("-inf")).softmax(-1).mean(1).sum(1)     # [kvh, ctx]
        pad = nblk * bs - p.ctx
        a = torch.nn.functional.pad(a, (0, pad)).view(kvh, nblk, bs).permute(1, 2, 0)
        cnt = torch.nn.functional.pad(sees.sum(0).float(), (0, pad)).view(nblk, bs)
        _accumulate(part.k, p.blocks, a.contiguous(), cnt)
        self.counters["zipcache_probe_queries"] += float(len(rows))
        return o

    def _decode(self, q, part, d, scale):
        B, maxblk = d.blocks.shape
        blocks = d.blocks.reshape(-1)
        uk, cmin, crange = part.k.codes(blocks)                       # [B*k, t, h, c], [B*k, h, c] x2
        uv, cnorm, tmin, trange = part.v.codes(blocks)                # ..., [B*k, h, c], [B*k, t, h] x2
        bs, kvh, dk = uk.shape[1], uk.shape[2], uk.shape[3]
        G = q.shape[1] // kvh
        qd = q[d.q_rows].float().view(B, kvh, G, dk)
        uk = uk.view(B, maxblk, bs, kvh, dk)
        qs = qd.unsqueeze(1) * crange.view(B, maxblk, kvh, 1, dk)    # [B, k, h, g, c]
        s = torch.einsum("bkhgc,bkthc->bhgkt", qs, uk)
        s = s + torch.einsum("bhgc,bkhc->bhgk", qd, cmin.view(B, maxblk, kvh, dk)).unsqueeze(-1)
        s = (s * scale).reshape(B, kvh, G, maxblk * bs)
        if d.mask is not None:
            s = s.masked_fill(~d.mask.view(B, 1, 1, -1), float("-inf"))
        p = s.softmax(-1).view(B, kvh, G, maxblk, bs)
        # saliency: every decode query is a probe
        probs = p.mean(2).permute(0, 2, 3, 1).reshape(B * maxblk, bs, kvh)
        valid = (d.mask.view(B, -1) if d.mask is not None else
                 torch.ones(B, maxblk * bs, dtype=torch.bool, device=q.device)).view(B * maxblk, bs).float()
        _accumulate(part.k, blocks, probs, valid)
        tmin = tmin.view(B, maxblk, bs, kvh).permute(0, 3, 1, 2).unsqueeze(2)     # [B, h, 1, k, t]
        trange = trange.view(B, maxblk, bs, kvh).permute(0, 3, 1, 2).unsqueeze(2)
        dv = uv.shape[-1]
        o = torch.einsum("bhgkt,bkthc->bhgkc", p * trange, uv.view(B, maxblk, bs, kvh, dv))
        o = o + (p * tmin).sum(-1, keepdim=True)
        o = (o * cnorm.view(B, maxblk, kvh, dv).permute(0, 2, 1, 3).unsqueeze(2)).sum(3)   # [B, h, g, c]
        return o.reshape(B, kvh * G, dv).to(q.dtype)
