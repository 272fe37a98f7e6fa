"""Confidence intervals for ``modelkit eval`` figures.

* Figures over scored positions (perplexity increase, KL, top-1 agreement): the
  positions of one held-out sequence are correlated, so the unit of resampling is the
  sequence. ``bootstrap`` draws sequences with replacement (seeded, ``n_boot`` times),
  recomputes each ratio-of-sums figure from per-sequence sums, and returns the
  percentile interval.
* Task accuracy kept on the items the original solves (a proportion of independent
  items): ``wilson`` interval.
* Task accuracy relative to the original's over all items (a ratio of two accuracies on
  the same items): ``paired_ratio`` resamples items, keeping each item's pair of outcomes.

Contract: ``per_sequence(base_scores, model_scores)`` takes the engine's score rows
(``(logprob, argmax, logprob_row)`` per continuation token) and returns per-sequence
sums; ``position_cis(sums)`` maps each figure name to ``[low, high]`` at 95%.
"""

from __future__ import annotations

import math

import torch


def wilson(k: int, n: int, z: float = 1.96) -> list[float] | None:
    """95% Wilson score interval of a proportion k/n (None for n = 0)."""
    if n <= 0:
        return None
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return [max(0.0, mid - half), min(1.0, mid + half)]


def paired_ratio(base: list[bool], model: list[bool], n_boot: int = 2000, seed: int = 0,
                 level: float = 0.95) -> tuple[float | None, list[float] | None]:
    """``sum(model) / sum(base)`` over the same items, and its percentile interval from items
    drawn with replacement (pairs kept together). None when the original solves none."""
    if len(base) != len(model):
        raise ValueError("paired_ratio: outcome lists of different lengths")
    if not any(base):
        return None, None
    b = torch.tensor(base, dtype=torch.float64)
    m = torch.tensor(model, dtype=torch.float64)
    gen = torch.Generator().manual_seed(seed)
    pick = torch.randint(0, len(b), (n_boot, len(b)), generator=gen)
    ratios = m[pick].sum(-1) / b[pick].sum(-1).clamp_min(1)
    q = torch.quantile(ratios, torch.tensor([(1 - level) / 2, 1 - (1 - level) / 2], dtype=torch.float64))
    return float(m.sum() / b.sum()), [float(q[0]), float(q[1])]


def per_sequence(base_scores, model_scores) -> dict[str, torch.Tensor]:
    """Per-sequence sums: nll of baseline and model, positions, agreements, KL sum and KL positions."""
    rows = {k: [] for k in ("nll_b", "nll_m", "n", "agree", "kl", "kl_n")}
    for ib, im in zip(base_scores, model_scores):
        kl = [float((sb[2].exp() * (sb[2] - sm[2])).sum()) for sb, sm in zip(ib, im)
              if sb[2] is not None and sm[2] is not None]
        rows["nll_b"].append(-sum(s[0] for s in ib))
        rows["nll_m"].append(-sum(s[0] for s in im))
        rows["n"].append(len(ib))
        rows["agree"].append(sum(sb[1] == sm[1] for sb, sm in zip(ib, im)))
        rows["kl"].append(sum(kl))
        rows["kl_n"].append(len(kl))
    return {k: torch.tensor(v, dtype=torch.float64) for k, v in rows.items()}


def figures(s: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The position figures from (possibly resampled, leading batch dims) per-sequence sums."""
    n = s["n"].sum(-1)
    ppl_b, ppl_m = torch.exp(s["nll_b"].sum(-1) / n), torch.exp(s["nll_m"].sum(-1) / n)
    return {"ppl_increase_pct": 100 * (ppl_m / ppl_b - 1), "top1_agreement": s["agree"].sum(-1) / n,
            "kl": s["kl"].sum(-1) / s["kl_n"].sum(-1).clamp_min(1)}


def bootstrap(s: dict[str, torch.Tensor], n_boot: int = 2000, seed: int = 0,
              level: float = 0.95) -> dict[str, list[float]]:
    """Percentile intervals of ``figures`` over sequences drawn with replacement."""
    m = len(s["n"])
    if m < 2:
        return {}
    gen = torch.Generator().manual_seed(seed)
    pick = torch.randint(0, m, (n_boot, m), generator=gen)
    figs = figures({k: v[pick] for k, v in s.items()})
    lo, hi = (1 - level) / 2, 1 - (1 - level) / 2
    out = {}
    for k, v in figs.items():
        q = torch.quantile(v, torch.tensor([lo, hi], dtype=v.dtype))
        out[k] = [float(q[0]), float(q[1])]
    if not bool(s["kl_n"].sum() > 0):
        out.pop("kl")
    return out
