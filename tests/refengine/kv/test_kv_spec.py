"""refengine.kv.spec: per-slot, per-head byte arithmetic (no torch)."""

import pytest

from refengine.kv.spec import CacheSpec, GroupSpec, HeadPart, ModelFacts, codec_bytes


def group(k=(64, 64, 64), v=(64, 64, 64), **kw):
    return GroupSpec(slot=0, layers=(0,), kv_heads=len(k), head_dim=64, q_per_kv=3, elem_bytes=4,
                     k_dims=tuple(k), v_dims=tuple(v), **kw)


def test_dense_bytes_per_token_is_heads_times_dims():
    g = group()
    assert g.device_bytes_per_token == 2 * 3 * 64 * 4 and g.host_bytes_per_token == 0
    assert g.uniform and g.parts == [HeadPart((0, 1, 2), 64, 64)]


def test_ragged_heads_cost_their_own_size_not_the_maximum():
    g = group(k=(16, 40, 16), v=(24, 40, 24))
    assert g.k_bytes_per_token == (16 + 40 + 16) * 4 and g.v_bytes_per_token == (24 + 40 + 24) * 4
    assert g.parts == [HeadPart((0, 2), 16, 24), HeadPart((1,), 40, 40)]   # equal sizes share a part
    assert g.v_width == 88 and g.out_width == 3 * 88
    assert not g.uniform


def test_fp8_adds_one_scale_per_token_head():
    g = group(k=(16, 40, 16), codec="fp8")
    assert g.k_bytes_per_token == (16 + 4) + (40 + 4) + (16 + 4)
    assert codec_bytes("fp8", 64, 4) == 68 and codec_bytes("dense", 64, 2) == 128
    with pytest.raises(ValueError):
        codec_bytes("int3", 64, 2)


def test_v_on_host_moves_v_bytes_out_of_the_device_pool():
    g = group(v_on_host=True)
    assert g.device_bytes_per_token == 3 * 64 * 4 and g.host_bytes_per_token == 3 * 64 * 4


def test_spec_checks_dims():
    with pytest.raises(ValueError):
        group(k=(64, 64))                      # not one entry per head
    with pytest.raises(ValueError):
        group(k=(0, 64, 64))


def test_cache_spec_for_swiftkv_acrosskv_sums_slots():
    f = ModelFacts("/m", num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64, elem_bytes=4,
                   swiftkv_layers=15, group_size=2)
    spec = CacheSpec.for_model(f)
    assert spec.num_slots == 23 and spec.device_bytes_per_token == 23 * 2 * 3 * 64 * 4 == 35328
    assert spec.slot_of(16).layers == (15, 16) and spec.slot_of(29).layers == (29,)
