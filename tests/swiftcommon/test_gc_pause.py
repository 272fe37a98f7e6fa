"""``swiftcommon.gc_pause.gc_paused``: the collector is off inside, back on after (also after an
exception), and left off where it was off."""

from __future__ import annotations

import gc

import pytest

from swiftcommon.gc_pause import gc_paused


def test_paused_inside_and_restored_after():
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()           # the inner block does not turn it back on early
    assert gc.isenabled()
    with pytest.raises(ValueError), gc_paused():
        raise ValueError
    assert gc.isenabled()


def test_left_off_where_it_was_off():
    gc.disable()
    try:
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
