"""Block pool invariants (no torch, no model)."""

import sys

from refengine.block_manager import BlockManager


def test_allocation_grows_and_frees():
    bm = BlockManager(num_blocks=4, block_size=4)
    assert bm.ensure("a", 5)               # 2 blocks
    assert len(bm.table("a")) == 2 and bm.num_free == 2
    assert bm.ensure("a", 8)               # still 2 blocks
    assert bm.num_free == 2
    assert bm.ensure("b", 8)
    assert bm.num_free == 0
    assert not bm.ensure("c", 1)           # no change on failure
    assert bm.table("c") == [] and bm.num_free == 0
    assert not bm.ensure("a", 9)           # needs a 3rd block: refused, table kept
    assert len(bm.table("a")) == 2
    bm.free("a")
    assert bm.num_free == 2 and bm.usage() == 0.5
    bm.free("a")                           # idempotent
    assert bm.num_free == 2


def test_blocks_are_exclusive():
    bm = BlockManager(num_blocks=10, block_size=2)
    for i in range(5):
        assert bm.ensure(f"r{i}", 3)
    owned = [b for i in range(5) for b in bm.table(f"r{i}")]
    assert len(owned) == len(set(owned)) == 10


def test_scheduler_modules_do_not_import_torch():
    for name in ("refengine.block_manager", "refengine.scheduler", "refengine.request"):
        __import__(name)
    # torch may be imported by other tests in this process; check the modules' own imports.
    import inspect

    import refengine.block_manager as bm
    import refengine.scheduler as sc
    for mod in (bm, sc):
        assert "import torch" not in inspect.getsource(mod)
    assert sys.modules.get("refengine.block_manager") is bm


def test_truncate_frees_trailing_blocks_for_reuse():
    bm = BlockManager(num_blocks=6, block_size=4)
    assert bm.ensure("a", 18)                      # 5 blocks
    kept, tail = bm.table("a")[:2], bm.table("a")[2:]
    assert bm.truncate("a", 7) == tail             # 7 entries need 2 blocks
    assert bm.table("a") == kept and bm.num_free == 4
    assert bm.ensure("b", 16) and set(tail) <= set(bm.table("b"))   # freed blocks go to another request
    assert bm.truncate("zzz", 3) == []
    assert bm.num_free + len(bm.table("a")) + len(bm.table("b")) == bm.num_blocks
