"""SnapKV-style eviction: the kept tokens follow the observation window's attention, each head's
kept entries are compacted to the front of the block table (decode then equals attention over
exactly those tokens), RoPE keeps true positions while attention uses cache offsets, and the
freed blocks serve another request."""

import pytest
import torch
from kv_slot_support import OneSlot, reference

from refengine.kv.methods.eviction.method import EvictionMethod

T, D = 20, 8
PEAKS = {0: (3, 11), 1: (5, 7)}           # KV head -> prompt positions the window queries look at


def _prompt(seed=0):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(T + 1, 2, D, generator=g) * 0.3
    v = torch.randn(T + 1, 2, D, generator=g)
    q = torch.randn(T + 1, 2, D, generator=g) * 0.3
    for h, peaks in PEAKS.items():
        for p in peaks:
            k[p, h] = 4 * torch.eye(D)[h]
        q[T - 4:T, h] = 4 * torch.eye(D)[h]                 # the observation window (last 4 prompt tokens)
    return q, k, v


def _evicted(opts):
    q, k, v = _prompt()
    s = OneSlot([EvictionMethod({"window": 4, "kernel": 1, **opts})], kvh=2, G=1, d=D)
    s.req.num_tokens = T
    s.step(q[:T], k[:T], v[:T], 0, ends_prefill=True)
    return s, q, k, v


def test_the_window_attention_picks_the_kept_tokens_and_the_window_stays():
    s, q, k, v = _evicted({"budget": 6})
    assert [(e.request_id, e.num_cached) for e in s.edits] == [("r", 6)]
    part = s.slot.parts[0]
    blocks = torch.tensor(s.table[:2])
    kept_k = part.k.gather(blocks).flatten(0, 1)[:6]                        # compacted entries, per head
    for h, peaks in PEAKS.items():
        want = list(peaks) + list(range(T - 4, T))
        assert torch.equal(kept_k[:, h], k[want, h])
        assert torch.equal(part.v.gather(blocks).flatten(0, 1)[:6, h], v[want, h])


def test_pooling_keeps_the_neighbours_of_a_peak():
    s, q, k, v = _evicted({"budget": 6, "kernel": 3, "pooling": "max"})
    part = s.slot.parts[0]
    kept = part.k.gather(torch.tensor(s.table[:1])).flatten(0, 1)[:2, 0]
    near = {i for p in PEAKS[0] for i in (p - 1, p, p + 1)}
    assert all(any(torch.equal(row, k[i, 0]) for i in near) for row in kept)


def test_decode_after_eviction_attends_exactly_to_the_kept_tokens():
    s, q, k, v = _evicted({"budget": 6})
    out = s.step(q[T:T + 1], k[T:T + 1], v[T:T + 1], 6)[0]                 # the new token is cache entry 6
    for h, peaks in PEAKS.items():
        idx = list(peaks) + list(range(T - 4, T + 1))
        ref = reference(q[T:T + 1, h:h + 1], k[idx, h:h + 1], v[idx, h:h + 1], len(idx) - 1, D ** -0.5)
        assert torch.allclose(out[h], ref[0, 0], atol=1e-5)


def test_a_prompt_within_the_budget_is_left_alone():
    s, q, k, v = _evicted({"budget": 32, "window": 4})
    assert s.edits == []


@pytest.mark.slow
@pytest.mark.model
def test_engine_positions_and_freed_blocks_reused(smollm2_dir):
    from refengine.config import EngineConfig
    from refengine.engine import LLMEngine
    from refengine.sampling_params import SamplingParams

    eng = LLMEngine(EngineConfig(model=str(smollm2_dir), max_model_len=96, num_kv_blocks=6, block_size=16,
                                 kv_methods={"eviction": {"budget": 16, "window": 4}}))
    seen = []
    forward = eng.runner.model.forward

    def spy(input_ids, positions, kv, attn_all, slots, *rest):
        batch = attn_all[0]                                             # one attention group: no window
        lengths = batch.decode.lengths if batch.decode is not None else []
        seen.append((positions.tolist(), slots[0].tolist(), lengths))
        return forward(input_ids, positions, kv, attn_all, slots, *rest)

    eng.runner.model.forward = spy
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    eng.add_request("a", list(range(1000, 1040)), params)               # 3 blocks
    eng.step()
    a = eng.scheduler.requests["a"]
    table_before = list(eng.block_manager.table("a"))
    assert (a.num_computed_tokens, a.num_evicted, a.num_cached_tokens) == (40, 24, 16)
    assert len(table_before) == 1 and eng.block_manager.num_free == 5
    assert eng.stats().extra["eviction_blocks_freed"] == 2
    eng.add_request("b", list(range(2000, 2060)), params)               # needs 4 blocks: only free after eviction
    eng.step()
    positions, slots, lengths = seen[-1]
    assert positions[0] == 40 and lengths[0] == 17                      # RoPE: true position; attention: entries
    assert slots[0] == eng.block_manager.table("a")[1] * 16               # entry 16 opens a new block
    assert positions[1:] == list(range(60)) and len(eng.scheduler.running) == 2
    freed = {x // 16 for x in seen[0][1]} - set(table_before)
    # Only 3 blocks were free before eviction and this step needed 5 (a's entry 16, b's 4): both freed
    # blocks were reused (which request takes which follows the block manager's free-list order).
    assert len(freed) == 2 and freed <= {x // 16 for x in slots}
    assert len(eng.block_manager.table("b")) == 1                           # and b was compressed in turn
    while eng.has_unfinished():
        eng.step()
    assert eng.block_manager.num_free == 6
