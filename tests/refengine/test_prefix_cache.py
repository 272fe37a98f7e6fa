"""Prefix caching and scheduling fairness in the block manager and scheduler (no model, no torch)."""

import pytest

from refengine.block_manager import BlockManager
from refengine.request import Request
from refengine.sampling_params import SamplingParams
from refengine.scheduler import Scheduler


def make(rid, tokens, max_tokens=2):
    return Request(rid, list(tokens), SamplingParams(max_tokens=max_tokens), eos_token_ids=(0,), max_model_len=10_000)


def run(s: Scheduler, token=7):
    out = s.schedule()
    sampled = {c.request.request_id: [token] for c in out.chunks if c.needs_logits}   # the tokens a request got
    s.update(out, sampled)
    return out


def cached(num_blocks: int, block_size: int, budget: int = 100, **kw) -> tuple[BlockManager, Scheduler]:
    bm = BlockManager(num_blocks, block_size, enable_prefix_caching=True, **kw)
    return bm, Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=budget)


def serve_one(s: Scheduler, rid: str, tokens, max_tokens=1) -> None:
    s.add(make(rid, tokens, max_tokens=max_tokens))
    drain(s)


def drain(s: Scheduler):
    outs = []
    while s.has_unfinished():
        outs.append(run(s))
    return outs


def check_invariants(bm: BlockManager):
    refs = {}
    for table in bm._tables.values():
        for b in table:
            refs[b] = refs.get(b, 0) + 1
    assert all(bm._ref[b] == n for b, n in refs.items())
    assert set(bm._free) == {b for b in range(bm.num_blocks) if bm._ref[b] == 0}
    assert set(bm._free).isdisjoint(refs)
    assert all(bm._hash_of[b] == h for h, b in bm._cached.items())


def test_second_request_reuses_full_prompt_blocks_and_computes_the_rest():
    bm, s = cached(64, 4)
    shared = list(range(1, 17))                       # 4 full blocks
    s.add(make("a", shared + [100, 101, 102]))
    drain(s)
    check_invariants(bm)
    s.add(make("b", shared + [200, 201]))
    first = s.schedule().chunks[0]
    assert first.start == 16 and first.num_tokens == 2    # only the unique suffix is computed
    assert (bm.prefix_queries, bm.prefix_hits) == (19 + 18, 16)
    check_invariants(bm)


def test_last_prompt_token_is_always_computed_and_shared_blocks_are_never_written():
    bm, s = cached(64, 4)
    prompt = list(range(1, 17))                       # exactly 4 blocks
    s.add(make("a", prompt, max_tokens=1))
    drain(s)
    s.add(make("b", prompt, max_tokens=1))
    c = s.schedule().chunks[0]
    # 3 blocks reused; the 4th block is recomputed into a block b owns alone
    assert (c.start, c.num_tokens) == (12, 4)
    assert bm._ref[c.block_table[3]] == 1 and all(bm._ref[b] == 1 for b in c.block_table)


def test_concurrent_requests_share_blocks_with_reference_counts():
    bm, s = cached(64, 4)
    shared = list(range(1, 13))
    s.add(make("a", shared + [50], max_tokens=5))
    run(s)                                            # a prefilled, its blocks registered
    s.add(make("b", shared + [60], max_tokens=5))
    run(s)
    ta, tb = bm.table("a"), bm.table("b")
    assert ta[:3] == tb[:3] and all(bm._ref[b] == 2 for b in ta[:3])
    check_invariants(bm)
    s.abort("a")
    assert all(bm._ref[b] == 1 for b in tb[:3])       # still held by b
    check_invariants(bm)
    drain(s)
    assert bm.num_free == 64 and bm.num_cached_blocks >= 3
    check_invariants(bm)


def test_lru_evicts_least_recently_freed_cached_blocks_first():
    bm, s = cached(8, 2)
    serve_one(s, "old", [1, 2, 3, 4, 5])
    serve_one(s, "new", [9, 8, 7, 6, 5])
    # Fill the pool except for what a 5-token prompt needs: the older prefix is evicted first.
    s.add(make("filler", list(range(20, 32)), max_tokens=1))
    run(s)
    assert bm.lookup("probe-new", [9, 8, 7, 6, 5]) != []
    assert bm.lookup("probe-old", [1, 2, 3, 4, 5]) == []
    check_invariants(bm)


def test_chain_hash_depends_on_the_whole_prefix_and_the_salt():
    bm, s = cached(32, 2)
    serve_one(s, "a", [1, 2, 3, 4, 9])
    assert len(bm.lookup("x", [1, 2, 3, 4, 0])) == 2
    assert bm.lookup("y", [5, 6, 3, 4, 0]) == []      # same second block, other first block: no hit
    other = BlockManager(32, 2, enable_prefix_caching=True, salt=b"fp8")
    other._cached = dict(bm._cached)
    assert other.lookup("z", [1, 2, 3, 4, 0]) == []   # another salt (KV method, dtype) never matches


def test_disabled_caching_never_hits_and_counts_nothing():
    bm = BlockManager(32, 2)
    s = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=100)
    for rid in ("a", "b"):
        s.add(make(rid, [1, 2, 3, 4, 5], max_tokens=1))
        assert s.schedule().chunks[0].start == 0
        drain(s)
    assert (bm.prefix_queries, bm.prefix_hits, bm.num_cached_blocks) == (0, 0, 0)


def test_truncate_is_refused_with_caching_on():
    bm = BlockManager(8, 2, enable_prefix_caching=True)
    bm.allocate("a", [], 6, 6)
    with pytest.raises(RuntimeError):
        bm.truncate("a", 2)


def test_preempted_request_resumes_from_its_cached_blocks():
    bm, s = cached(6, 4)
    s.add(make("a", list(range(1, 13)), max_tokens=8))
    s.add(make("b", list(range(30, 42)), max_tokens=8))
    outs = drain(s)
    assert s.num_preemptions > 0
    resumed = [c for o in outs for c in o.chunks if c.request.num_preemptions and c.start > 0 and c.num_tokens > 1]
    assert resumed, "a preempted request recomputed its whole prefix"
    check_invariants(bm)


def test_copies_of_one_prompt_are_prefilled_once():
    bm, s = cached(64, 4)
    prompt = list(range(1, 30))
    for i in range(3):                                 # n=3 choices arrive as three requests
        s.add(make(f"c{i}", prompt, max_tokens=2))
    computed = sum(c.num_tokens for o in drain(s) for c in o.chunks)
    # one full prefill (29) + two suffixes of 1 token (28 cached) + 2 decodes each... = 29 + 2 + 3
    assert computed == 29 + 2 * 1 + 3 * 1


def test_tail_advances_when_budget_is_smaller_than_running_requests():
    bm = BlockManager(64, 4)
    s = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=4)
    for i in range(4):
        s.add(make(f"r{i}", [5], max_tokens=50))
    run(s)                                             # all four admitted
    s.max_num_batched_tokens = 2                       # now fewer tokens than running requests
    served = [[c.request.request_id for c in run(s).chunks] for _ in range(3)]
    assert served == [["r0", "r1"], ["r2", "r3"], ["r0", "r1"]]


def test_long_prefill_cap_bounds_one_requests_share():
    bm = BlockManager(64, 4)
    s = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=64, long_prefill_cap=16)
    s.add(make("long", range(1, 101)))
    s.add(make("short", range(200, 210)))
    out = s.schedule()
    assert [(c.request.request_id, c.num_tokens) for c in out.chunks] == [("long", 16), ("short", 10)]
