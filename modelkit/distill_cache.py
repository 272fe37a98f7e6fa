"""Per-window cache of what the frozen part of distillation produces (``--cache DIR``).

Layers ``0..l-1`` are identical and frozen in teacher and student, and the teacher is
frozen too, so for a given training window they always produce the same tensors. A
window's first visit computes them and writes one file; every later visit (the next
epoch, another run on the same corpus and ``l``, a resumed run) loads it and runs only
the student, which is where the gradient is:

  ``h``        hidden state entering layer ``l`` [T, H] (``--cache-dtype``, default float16)
  ``idx``      the teacher's top-k token ids per position [T, k] (int32)
  ``val``      their logits [T, k] (float32)
  ``lse``      log-sum-exp of the teacher's logits / T over the full vocabulary [T] (float32)
  ``penult``   teacher hidden state before the last layer [T, H] (for ``--hidden-mse``; always
               stored, so runs with and without the term share one cache)

Loss on cached targets (``topk_kl``): the teacher's distribution at temperature T is
coarsened to k+1 outcomes (its top-k tokens and "any other token"), the student's
distribution is coarsened the same way, and KL(teacher || student) of the coarsened
pair is taken (times T^2). It is exact when the top-k cover the teacher's mass and a
lower bound of the full KL otherwise; the trainer uses it for hits and misses alike,
so a run does not depend on which windows were already cached.

Contract: ``WindowCache(dir, meta)`` refuses a directory written with another
``meta`` (model, l, seq_len, k, T, corpus windows, dtype); ``get(i, ids)`` returns the
tensors of window ``i`` or None, ``put`` writes atomically, so a killed run leaves only
whole files and resuming recomputes nothing that was written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F


def teacher_targets(t_logits: torch.Tensor, k: int, temperature: float) -> dict[str, torch.Tensor]:
    """Top-k ids, logits and the full log-sum-exp at ``temperature`` of teacher logits [..., V]."""
    t = t_logits.float()
    val, idx = t.topk(k, dim=-1)
    return {"idx": idx.to(torch.int32), "val": val, "lse": torch.logsumexp(t / temperature, -1)}


def topk_kl(s_logits: torch.Tensor, idx: torch.Tensor, val: torch.Tensor, lse: torch.Tensor,
            temperature: float = 2.0) -> torch.Tensor:
    """KL(teacher || student) over {top-k tokens, rest} at temperature T, times T^2, mean over tokens."""
    s = F.log_softmax(s_logits.float() / temperature, -1)
    idx = idx.long()
    logp_t = val / temperature - lse.unsqueeze(-1)                      # teacher log-probs of its top-k
    logq_s = s.gather(-1, idx)
    p_top = logp_t.exp()
    kl = (p_top * (logp_t - logq_s)).sum(-1)
    if idx.shape[-1] < s.shape[-1]:                                     # the "any other token" outcome
        p_rest = (1 - p_top.sum(-1)).clamp_min(1e-12)
        logq_rest = s.scatter(-1, idx, float("-inf")).logsumexp(-1)     # exact, no 1 - sum cancellation
        kl = kl + p_rest * (p_rest.log() - logq_rest)
    return kl.mean() * temperature ** 2


class WindowCache:
    def __init__(self, directory: str | Path, meta: dict):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.meta = meta
        path = self.dir / "meta.json"
        if path.exists():
            was = json.loads(path.read_text())
            diff = {k: (was.get(k), v) for k, v in meta.items() if was.get(k) != v}
            if diff:
                raise SystemExit(f"cache {self.dir} was written for other settings: {diff}; use another --cache")
        else:
            path.write_text(json.dumps(meta, indent=2))
        self.hits = self.misses = 0

    def _file(self, i: int) -> Path:
        return self.dir / f"w{i:07d}.pt"

    def get(self, i: int, ids: torch.Tensor) -> dict[str, torch.Tensor] | None:
        f = self._file(i)
        if not f.exists():
            self.misses += 1
            return None
        rec = torch.load(f, weights_only=True)
        if not torch.equal(rec["ids"], ids.cpu()):
            raise SystemExit(f"{f} holds another window (corpus or windows changed); use a new --cache")
        self.hits += 1
        return rec

    def put(self, i: int, rec: dict[str, torch.Tensor]) -> None:
        f = self._file(i)
        tmp = f.with_suffix(".tmp")
        torch.save({k: v.detach().cpu().contiguous() for k, v in rec.items()}, tmp)
        os.replace(tmp, f)

    def count(self) -> int:
        return sum(1 for _ in self.dir.glob("w*.pt"))
