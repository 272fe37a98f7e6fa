"""ZACK rank planning: eps -> ranks, rate -> shared eps (adaptive) and uniform ranks."""

import numpy as np
import pytest

from refengine.kv.methods.zack import ranks as zr


def test_rank_is_smallest_keeping_dropped_mass_within_eps():
    s = np.array([4.0, 3.0, 2.0, 1.0])          # total 10
    assert zr.ranks_for_eps(s, 0.0) == 4
    assert zr.ranks_for_eps(s, 0.1) == 3        # drop 1 (10%)
    assert zr.ranks_for_eps(s, 0.29) == 3       # dropping 3 (30%) is too much
    assert zr.ranks_for_eps(s, 0.3) == 2
    assert zr.ranks_for_eps(s, 1.0) == 1        # never below one dimension
    assert zr.ranks_for_eps(s, 0.1, multiple=2) == 4


def test_adaptive_reaches_the_rate_with_the_smallest_eps():
    rng = np.random.default_rng(0)
    # heads with fast- and slow-decaying spectra: adaptive gives the fast ones fewer dims
    decay = np.array([0.5, 0.9, 0.97])[None, :, None] ** np.arange(32)[None, None, :]
    s_qk = decay * rng.uniform(1, 2, (4, 3, 1))
    s_vo = s_qk[:, ::-1]
    for rate in (0.0, 0.25, 0.5, 0.7):
        k, v, eps = zr.adaptive(s_qk, s_vo, rate)
        got = zr.overall_rate(k, v, 32)
        assert got >= rate - 1e-12
        assert (k[:, 0] <= k[:, 2]).all()        # the fast-decaying head keeps fewer dims
        # one step less compression would miss the rate: eps is minimal
        smaller = eps - 1e-9
        if eps > 0:
            assert zr.overall_rate(zr.ranks_for_eps(s_qk, smaller), zr.ranks_for_eps(s_vo, smaller), 32) < rate
    with pytest.raises(ValueError, match="out of reach"):
        zr.adaptive(s_qk, s_vo, 0.99)


def test_uniform_ranks():
    k, v = zr.uniform((2, 3), 64, 0.5)
    assert (k == 32).all() and (v == 32).all() and zr.overall_rate(k, v, 64) == 0.5
    k, _ = zr.uniform((1, 1), 64, 0.3, multiple=8)
    assert k[0, 0] == 48                       # 64 - 19 = 45 -> 48


def test_layerwise_keeps_one_rank_per_slot_and_still_reaches_the_rate():
    rng = np.random.default_rng(1)
    # slots whose heads all decay fast compress more than slots with a slow head
    decay = np.array([0.5, 0.6, 0.97, 0.98])[:, None, None] ** np.arange(32)[None, None, :]
    s_qk = decay * rng.uniform(1, 2, (4, 3, 1))
    s_vo = s_qk.copy()
    for rate in (0.25, 0.5):
        k, v, eps = zr.adaptive(s_qk, s_vo, rate, multiple=8, per_slot=True)
        assert (k == k[:, :1]).all() and (v == k).all()            # one size per slot, K and V alike
        assert (k % 8 == 0).all() and zr.overall_rate(k, v, 32) >= rate - 1e-12
        assert k[0, 0] <= k[3, 0]                                  # the fast-decaying slot keeps fewer dims
        # the envelope of the per-head ranks at that eps: no head gets fewer dims than adaptive gives it
        assert (k >= zr.ranks_for_eps(s_qk, eps, 8)).all() and (k >= zr.ranks_for_eps(s_vo, eps, 8)).all()
        assert (k == zr.ranks_for_eps(s_qk, eps, 8).max(axis=1, keepdims=True)).any()
