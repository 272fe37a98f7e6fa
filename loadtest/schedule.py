"""Arrival schedules, precomputed from a seed before the run starts.

``poisson``: exponential gaps with mean 1/rate. ``gamma``: gamma gaps with shape
``burstiness`` and the same mean (burstiness < 1 is burstier than Poisson, 1 is Poisson,
> 1 more regular), as vLLM's benchmark defines it. ``constant``: equal gaps.
rate = inf sends everything at t=0. Times are offsets in seconds from the start.
"""

from __future__ import annotations

import math

import numpy as np


def arrival_times(n: int, rate: float, kind: str = "poisson", burstiness: float = 1.0, seed: int = 0) -> list[float]:
    if n <= 0:
        return []
    if math.isinf(rate):
        return [0.0] * n
    if rate <= 0:
        raise ValueError("rate must be > 0 (or inf)")
    rng = np.random.default_rng(seed)
    if kind == "constant":
        gaps = np.full(n, 1.0 / rate)
    elif kind == "poisson":
        gaps = rng.exponential(1.0 / rate, n)
    elif kind == "gamma":
        if burstiness <= 0:
            raise ValueError("burstiness must be > 0")
        gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)
    else:
        raise ValueError(f"unknown arrival kind {kind!r} (poisson, gamma, constant)")
    gaps[0] = 0.0            # the first request goes at t=0
    return np.cumsum(gaps).tolist()
