"""A/B: variants measured side by side in one run, and how they are compared.

``interleaved(names, rounds, run)``: every variant once a round, the order rotated each round (a
drift of a shared machine, or a warm cache, hits every variant alike); ``run(name, round)`` is
one measurement, and the result is ``name -> [result of each round]``.
``paired_ratio(new, base)``: the median over rounds of ``new / base`` measured in the same round
(what drift does to a round cancels in its ratio). ``medians(runs, keys)``: per key, the median
over runs of that figure (a key a run does not report, ``None``, is left out).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence


def interleaved(names: Sequence[str], rounds: int, run: Callable[[str, int], object]) -> dict[str, list]:
    out: dict[str, list] = {name: [] for name in names}
    for r in range(rounds):
        k = r % len(names)
        for name in [*names[k:], *names[:k]]:
            out[name].append(run(name, r))
    return out


def paired_ratio(new: Sequence[float], base: Sequence[float]) -> float:
    return statistics.median(b / a for a, b in zip(base, new, strict=True))


def medians(runs: Sequence[dict], keys: Sequence[str]) -> dict[str, float]:
    return {k: statistics.median(x[k] for x in runs) for k in keys if runs[0][k] is not None}
