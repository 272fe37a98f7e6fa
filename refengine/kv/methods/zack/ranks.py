"""ZACK ranks: from an overall compression rate to per-head K and V sizes. NumPy only.

Definitions (ZACK paper, section 5.2):
- A head's singular values ``s`` (descending, ``d`` of them) come from the SVD of its
  calibration matrix (stacked Q and K for keys, V and the head's W_o slice for values).
- Rank for a removal ratio ``eps``: the smallest ``r >= 1`` whose dropped singular
  values ``s[r:]`` sum to at most ``eps * s.sum()``.
- Overall rate: the fraction of K and V elements removed over every head of every
  cache slot, ``1 - sum(k_r + v_r) / (slots * heads * 2d)``. Higher = smaller cache.
- Adaptive: one shared ``eps`` for every head of every slot; the requested rate is met
  by the smallest ``eps`` whose rate reaches it (search over the finitely many
  ``eps`` values at which some rank changes). Layer-wise: the same search, but every
  head of a slot (and K and V) keeps the slot's largest adaptive rank: one head size per
  cache slot, what vLLM's cache can hold. Uniform: every head keeps ``d - round(rate * d)``
  dimensions.
``multiple`` rounds every rank up to a multiple (kernel-friendly shapes).
"""

from __future__ import annotations

import numpy as np


def tail_fractions(s: np.ndarray) -> np.ndarray:
    """``[..., d] -> [..., d + 1]``: fraction of the singular-value sum dropped when keeping r."""
    s = np.clip(np.asarray(s, dtype=np.float64), 0, None)
    total = s.sum(-1, keepdims=True)
    total = np.where(total > 0, total, 1.0)
    rev = np.cumsum(s[..., ::-1], axis=-1)[..., ::-1] / total      # rev[r] = s[r:].sum() / total
    return np.concatenate([rev, np.zeros(s.shape[:-1] + (1,))], axis=-1)


def ranks_for_eps(s: np.ndarray, eps: float, multiple: int = 1) -> np.ndarray:
    """Per head (last axis = singular values): the smallest rank dropping at most ``eps``."""
    tf = tail_fractions(s)
    d = tf.shape[-1] - 1
    r = np.argmax(tf <= eps + 1e-12, axis=-1)
    return _round(np.maximum(r, 1), d, multiple)


def _round(r: np.ndarray, d: int, multiple: int) -> np.ndarray:
    return np.minimum(d, -(-np.asarray(r) // multiple) * multiple).astype(int)


def overall_rate(k_ranks: np.ndarray, v_ranks: np.ndarray, d: int) -> float:
    k, v = np.asarray(k_ranks), np.asarray(v_ranks)
    return float(1.0 - (k.sum() + v.sum()) / (2 * d * k.size))


def _envelope(k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per slot (first axis), the largest K or V rank of any head, for every head of K and V."""
    top = np.maximum(k.max(axis=-1), v.max(axis=-1))[..., None]
    full = np.broadcast_to(top, k.shape).copy()
    return full, full.copy()


def adaptive(s_qk: np.ndarray, s_vo: np.ndarray, rate: float, multiple: int = 1,
             per_slot: bool = False) -> tuple[np.ndarray, np.ndarray, float]:
    """``s_*``: ``[slots, heads, d]``. Returns (k_ranks, v_ranks, eps) for the requested rate;
    ``per_slot``: the layer-wise variant (one rank per slot, see the module docstring)."""
    s_qk, s_vo = np.asarray(s_qk, dtype=np.float64), np.asarray(s_vo, dtype=np.float64)
    d = s_qk.shape[-1]
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"rate must be in [0, 1), got {rate}")
    # Every eps at which some head's rank changes, plus 0: the rate is a step function of eps.
    cands = np.unique(np.concatenate([tail_fractions(s_qk).ravel(), tail_fractions(s_vo).ravel(), [0.0]]))
    lo, hi = 0, len(cands) - 1

    def at(i: int) -> tuple[np.ndarray, np.ndarray]:
        k, v = ranks_for_eps(s_qk, cands[i], multiple), ranks_for_eps(s_vo, cands[i], multiple)
        return _envelope(k, v) if per_slot else (k, v)

    k, v = at(hi)
    if overall_rate(k, v, d) < rate - 1e-12:
        best = overall_rate(k, v, d)
        raise ValueError(f"rate {rate} is out of reach: at most {best:.4f} with one dimension per head"
                         + (f" and ranks rounded to multiples of {multiple}" if multiple > 1 else ""))
    while lo < hi:                                # smallest candidate whose rate reaches the target
        mid = (lo + hi) // 2
        k, v = at(mid)
        if overall_rate(k, v, d) >= rate - 1e-12:
            hi = mid
        else:
            lo = mid + 1
    k, v = at(lo)
    return k, v, float(cands[lo])


def uniform(shape: tuple[int, int], d: int, rate: float, multiple: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Every head of every slot keeps the same number of dimensions."""
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"rate must be in [0, 1), got {rate}")
    r = _round(np.array(max(1, d - int(round(rate * d)))), d, multiple)
    full = np.full(shape, int(r))
    return full, full.copy()
