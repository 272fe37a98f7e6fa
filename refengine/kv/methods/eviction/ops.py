"""Eviction's tensor work: recording observation-window queries and choosing the kept tokens.

``Observer`` wraps a head part's attention op: for every sequence the method watches
(``method.watch[request id] = (lo, hi)`` cache indices), the query rows whose cache
index falls in ``[lo, hi)`` are copied aside before the wrapped op runs
(``[m, nq, dk]`` with their indices ``[m]`` and the softmax scale).

``select(part, seen, table, n, block_size, opts)`` -> ``[heads of the part, budget]`` kept cache
indices, ascending per head:
  K of the prompt [n, kvh, dk]; for each record: scores = softmax(q K^T * scale),
  causal (a query at index i sees keys <= i) -> summed over its query heads and rows
  -> [kvh, n]; pooled along positions (kernel, max or avg); the best ``budget - w``
  positions before the window [n - w, n) plus the window.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from refengine.attention import seq_rows


class Observer:
    def __init__(self, inner, method, key: tuple[int, int]):
        self.inner = inner
        self.method = method
        self.key = key

    def __call__(self, q: torch.Tensor, part, batch, scale: float) -> torch.Tensor:
        watch = self.method.watch
        if watch:
            for sid, r0, nrows, c0 in seq_rows(batch):
                rng = watch.get(sid)
                if rng is None:
                    continue
                a, b = max(c0, rng[0]), min(c0 + nrows, rng[1])
                if a >= b:
                    continue
                rows = q[r0 + a - c0:r0 + b - c0].clone()
                idx = torch.arange(a, b, device=q.device)
                self.method.seen.setdefault((*self.key, sid), []).append((idx, rows, scale))
        return self.inner(q, part, batch, scale)


def _pool(x: torch.Tensor, kernel: int, how: str) -> torch.Tensor:
    """Pool ``x [heads, n]`` along positions with a centred window (same length)."""
    if kernel <= 1:
        return x
    x = x.unsqueeze(1)
    if how == "max":
        return F.max_pool1d(x, kernel, stride=1, padding=kernel // 2).squeeze(1)
    return F.avg_pool1d(x, kernel, stride=1, padding=kernel // 2, count_include_pad=False).squeeze(1)


def scores(part, seen: list, table: list[int], n: int, bs: int) -> torch.Tensor:
    """Summed attention of the recorded queries over the first ``n`` cache entries: [kvh, n]."""
    blocks = torch.tensor(table[:-(-n // bs)], dtype=torch.long, device=part.k.device)
    k = part.k.gather(blocks).flatten(0, 1)[:n].float()                 # [n, kvh, dk]
    kvh = k.shape[1]
    total = torch.zeros(kvh, n, dtype=torch.float32, device=k.device)
    pos = torch.arange(n, device=k.device)
    for idx, rows, scale in seen:
        m = rows.shape[0]
        qv = rows.float().view(m, kvh, -1, rows.shape[-1])               # [m, kvh, G, dk]
        s = torch.einsum("mhgd,nhd->hgmn", qv, k) * scale
        s = s.masked_fill(pos.view(1, 1, 1, n) > idx.view(1, 1, m, 1), float("-inf"))
        total += s.softmax(-1).sum((1, 2))
    return total


def select(part, seen: list, table: list[int], n: int, bs: int, opts) -> torch.Tensor:
    """Kept cache indices per KV head of ``part``: ``[kvh, budget]``, ascending."""
    w, budget = min(opts.window, n), opts.budget
    kvh = len(part.part.heads)
    dev = part.k.device
    window = torch.arange(n - w, n, device=dev).expand(kvh, w)
    if not seen:                      # no recorded query reached this slot: keep the most recent tokens
        return torch.arange(n - budget, n, device=dev).expand(kvh, budget).contiguous()
    pooled = _pool(scores(part, seen, table, n, bs)[:, :n - w], opts.kernel, opts.pooling)
    top = pooled.topk(budget - w, dim=-1).indices.sort(dim=-1).values
    return torch.cat([top, window], dim=-1).contiguous()
