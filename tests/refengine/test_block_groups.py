"""``WindowedBlocks`` (torch-free): per-window block tables that free what their window left,
all-or-nothing allocation across groups, and the pool split."""

import pytest

from refengine.block_groups import WindowedBlocks, blocks_per_request, split_blocks
from refengine.block_manager import NULL_BLOCK


def test_window_slides_and_frees_blocks_it_left():
    bm = WindowedBlocks([None, 8], [20, 20], block_size=4)
    assert bm.allocate("a", [], 10, 10)                   # 3 blocks in each group
    bm.commit("a", list(range(10)), 10)                   # next query at 10 sees keys 3..10: block 0 still read
    assert NULL_BLOCK not in bm.tables("a")[1] and bm.blocks_dropped == 0
    bm.commit("a", list(range(12)), 12)                   # next query at 12 sees keys 5..12: block 0 is dead
    glob, win = bm.tables("a")
    assert len(glob) == len(win) == 3 and NULL_BLOCK not in glob
    assert win[0] == NULL_BLOCK and NULL_BLOCK not in win[1:]
    assert bm.groups[1].num_used == 2 and bm.groups[0].num_used == 3 and bm.blocks_dropped == 1
    for n in range(11, 40):                               # decode: the window keeps at most 3 live blocks
        assert bm.ensure("a", n)
        bm.commit("a", [], n)
        first_seen = n - 8 + 1
        live = [b for b in bm.tables("a")[1] if b != NULL_BLOCK]
        assert len(live) == -(-n // 4) - first_seen // 4 <= 3
    assert bm.groups[0].num_used == 10                    # the global table keeps every block
    bm.free("a")
    assert bm.num_used == 0 and bm.num_free == 40


def test_allocation_is_all_or_nothing_across_groups():
    bm = WindowedBlocks([None, 8], [10, 3], block_size=4)
    assert not bm.allocate("a", [], 16, 16)               # the window pool has 3 blocks, 4 needed
    assert bm.num_used == 0 and bm.tables("a") == [[], []]
    assert bm.allocate("a", [], 12, 16)
    assert not bm.ensure("a", 16)                         # a 4th window block is not there yet
    assert bm.tables("a")[0] == bm.groups[0].table("a") and len(bm.tables("a")[0]) == 3
    bm.commit("a", [], 12)                                # the window left block 0 of 3
    assert bm.ensure("a", 16) and bm.groups[1].num_used == 3


def test_prefix_caching_and_truncation_are_off():
    bm = WindowedBlocks([None, 8], [8, 8], block_size=4)
    assert not bm.enable_prefix_caching and bm.lookup("a", list(range(20))) == []
    with pytest.raises(RuntimeError, match="eviction"):
        bm.truncate("a", 4)


def test_pools_are_split_by_what_a_full_request_needs():
    # 4096-token context, 512-token window, 1024-token chunks, 16-token blocks.
    assert blocks_per_request(None, 4096, 1024, 16) == 256
    assert blocks_per_request(512, 4096, 1024, 16) == 97
    assert blocks_per_request(512, 100, 1024, 16) == 7    # never more than the context itself
    counts = split_blocks(1000 * (256 * 3 + 97 * 15), [None, 512], [3, 15], 4096, 1024, 16)
    assert counts == [256 * 1000, 97 * 1000]
