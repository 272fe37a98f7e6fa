"""Scheduler: token budget, chunked prefill, max_num_seqs, preemption, abort (no model)."""

from refengine.block_manager import BlockManager
from refengine.request import Request, RequestStatus
from refengine.sampling_params import SamplingParams
from refengine.scheduler import Scheduler


def make(rid, n_prompt, max_tokens=4, **kw):
    return Request(rid, list(range(1, n_prompt + 1)), SamplingParams(max_tokens=max_tokens, **kw),
                   eos_token_ids=(0,), max_model_len=1000)


def run_step(s: Scheduler, token=7):
    out = s.schedule()
    sampled = {c.request.request_id: [token] for c in out.chunks if c.needs_logits}   # the tokens a request got
    return out, s.update(out, sampled)


def test_chunked_prefill_respects_budget_and_positions():
    s = Scheduler(BlockManager(100, 4), max_num_seqs=8, max_num_batched_tokens=10)
    s.add(make("a", 23))
    starts = []
    while True:
        out, touched = run_step(s)
        assert out.num_tokens <= 10
        starts.append((out.chunks[0].start, out.chunks[0].num_tokens))
        if touched:
            break
    assert starts == [(0, 10), (10, 10), (20, 3)]
    out, _ = run_step(s)                      # now a decode: one token at position 23
    assert [(c.start, c.num_tokens) for c in out.chunks] == [(23, 1)]


def test_decodes_first_then_new_prompts_share_budget():
    s = Scheduler(BlockManager(100, 4), max_num_seqs=8, max_num_batched_tokens=8)
    s.add(make("a", 3))
    run_step(s)                               # a prefilled, sampled 1 token
    s.add(make("b", 20))
    out, _ = run_step(s)
    assert [(c.request.request_id, c.num_tokens) for c in out.chunks] == [("a", 1), ("b", 7)]


def test_max_num_seqs():
    s = Scheduler(BlockManager(100, 4), max_num_seqs=2, max_num_batched_tokens=100)
    for i in range(3):
        s.add(make(f"r{i}", 2))
    out, _ = run_step(s)
    assert len(out.chunks) == 2 and len(s.waiting) == 1


def test_finish_by_length_and_eos_frees_blocks():
    bm = BlockManager(100, 4)
    s = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=100)
    s.add(make("a", 5, max_tokens=3))
    for _ in range(3):
        _, touched = run_step(s)
    assert touched[0].status is RequestStatus.FINISHED_LENGTH
    assert bm.num_used == 0 and not s.has_unfinished()
    s.add(make("b", 5, max_tokens=10))
    _, touched = run_step(s, token=0)         # EOS
    assert touched[0].status is RequestStatus.FINISHED_STOPPED
    s.add(make("c", 5, max_tokens=10, ignore_eos=True))
    _, touched = run_step(s, token=0)
    assert touched[0].status is RequestStatus.RUNNING


def test_preemption_recomputes_and_keeps_tokens():
    bm = BlockManager(num_blocks=4, block_size=2)     # 8 token slots in all
    s = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=100)
    s.add(make("a", 3, max_tokens=10))
    s.add(make("b", 3, max_tokens=10))
    run_step(s)                                        # a,b: prompt of 3 in 2 blocks each, 1 token sampled
    out, _ = run_step(s)                               # position 3 still fits in 2 blocks
    assert out.preempted == []
    out, _ = run_step(s)                               # position 4: a needs a 3rd block -> b preempted
    assert out.preempted == ["b"]
    b = s.requests["b"]
    assert b.status is RequestStatus.WAITING and b.num_computed_tokens == 0 and b.num_output_tokens == 2
    assert bm.table("b") == []


def test_abort_running_and_waiting():
    bm = BlockManager(10, 4)
    s = Scheduler(bm, max_num_seqs=1, max_num_batched_tokens=100)
    s.add(make("a", 3))
    s.add(make("b", 3))
    run_step(s)
    assert s.abort("a").status is RequestStatus.FINISHED_ABORTED
    assert s.abort("b").status is RequestStatus.FINISHED_ABORTED
    assert s.abort("b") is None and s.abort("zzz") is None
    assert bm.num_used == 0 and not s.has_unfinished()


def test_eviction_keeps_positions_and_counts_blocks_by_cache_entries():
    bm = BlockManager(num_blocks=20, block_size=4)
    s = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=100)
    s.add(make("a", 30, max_tokens=10))
    out, _ = run_step(s)
    assert out.chunks[0].ends_prefill and len(bm.table("a")) == 8
    freed = s.truncate("a", 10)                          # an eviction method kept 10 entries
    a = s.requests["a"]
    assert len(freed) == 5 and len(bm.table("a")) == 3
    assert (a.num_computed_tokens, a.num_evicted, a.num_cached_tokens) == (30, 20, 10)
    out, _ = run_step(s)                                 # decode: position 30, cache entry 10
    c = out.chunks[0]
    assert (c.start, c.cache_start, c.num_tokens, c.ends_prefill) == (30, 10, 1, False)
    for _ in range(2):
        run_step(s)                                      # entry 12 opens a 4th block
    assert a.num_cached_tokens == 13 and len(bm.table("a")) == 4
    try:
        s.truncate("a", 14)
        raise AssertionError("keeping more entries than cached must fail")
    except ValueError:
        pass


def test_preemption_resets_eviction_and_prefill_state():
    bm = BlockManager(num_blocks=6, block_size=2)
    s = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=100)
    s.add(make("a", 7, max_tokens=10))
    s.add(make("b", 3, max_tokens=10))
    run_step(s)
    s.truncate("a", 2)                                   # a: 1 block, b: 2 blocks
    for _ in range(3):
        out, _ = run_step(s)
    s.add(make("c", 3, max_tokens=10))
    while not s.requests["b"].num_preemptions and not s.requests["a"].num_preemptions:
        out, _ = run_step(s)
    victim = s.requests[out.preempted[-1]]
    assert (victim.num_computed_tokens, victim.num_evicted, victim.prefilled) == (0, 0, False)
    while victim.status is RequestStatus.WAITING or victim.num_computed_tokens < victim.num_tokens - 1:
        out, _ = run_step(s)
    ends = [c for c in out.chunks if c.request is victim]
    assert ends and ends[0].ends_prefill               # the recomputed prefill ends a prefill again
