"""KCache's host pool bounded (issue 32, item 5): ``kv_host_memory_gb`` (``--kv-host-memory-gb``)
caps the pool at the blocks whose host bytes fit, whichever of the device and host budgets is
smaller decides, admission follows from the block count (host bytes in use never pass the bound),
a bound that cannot hold one request of ``max_model_len`` is refused at start-up naming the flag,
and the start-up log and stats report device and host KV bytes apart."""

import logging

import pytest

from refengine.block_groups import cap_by_host
from refengine.config import EngineConfig
from refengine.engine import LLMEngine
from refengine.sampling_params import SamplingParams

GIB = 1 << 30
# SmolLM2 float32, KCache device_layers=2: V of layers 2-29 on the host, 28 x 3 heads x 64 x 4 B
# per token, 16 tokens per block.
HOST_PER_BLOCK = 28 * 3 * 64 * 4 * 16
KCACHE = {"kcache": {"top_n": 8, "device_layers": 2}}


def test_cap_by_host_keeps_the_smaller_budget():
    assert cap_by_host([100], [10], None) == [100]                    # no bound
    assert cap_by_host([100], [0], 5) == [100]                        # nothing on the host
    assert cap_by_host([100], [10], 1000) == [100]                    # fits exactly
    assert cap_by_host([100], [10], 999) == [99]                      # host decides: budget // bytes
    assert cap_by_host([100], [10], 5) == [0]
    assert cap_by_host([40, 10], [10, 10], 250) == [20, 5]            # table groups scaled alike
    out = cap_by_host([37, 11], [7, 3], 100)
    assert sum(n * b for n, b in zip(out, [7, 3])) <= 100


def engine(model, **kw):
    return LLMEngine(EngineConfig(model=str(model), max_model_len=256, block_size=16, kv_methods=KCACHE,
                                  max_num_batched_tokens=256, enable_prefix_caching=False, **kw))


@pytest.mark.model
def test_host_bound_sizes_the_pool_and_admission_keeps_within_it(smollm2_dir, caplog):
    # Device budget: hundreds of blocks; host bound: 20 blocks (a 256-token request needs 16).
    bound = 20.5 * HOST_PER_BLOCK / GIB
    with caplog.at_level(logging.INFO, logger="refengine.model_runner"):
        eng = engine(smollm2_dir, kv_cache_memory_gb=0.2, kv_host_memory_gb=bound)
    r = eng.runner
    assert r.kv.host_bytes_per_block == HOST_PER_BLOCK and r.host_bound
    assert r.num_blocks == eng.block_manager.num_blocks == 20
    assert r.kv.host_bytes_total == 20 * HOST_PER_BLOCK <= bound * GIB
    line = next(m for m in caplog.messages if m.startswith("KV memory:"))
    assert "device " in line and "host " in line and "which sized the pool" in line
    limit = eng.stats().extra["kv_host_bytes_limit"]
    assert limit == int(bound * GIB)
    # Three requests that would need 3 x 10 blocks: at most two fit; host bytes in use stay bounded.
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    for i in range(3):
        eng.add_request(f"r{i}", [1] + [(97 * i + 7 * j) % 4000 + 30 for j in range(150)], params)
    peak, finished = 0.0, 0
    while eng.has_unfinished():
        finished += sum(o.finished for o in eng.step())
        used = eng.stats().extra["kv_host_bytes_used"]
        assert used <= limit
        peak = max(peak, used)
        assert len(eng.scheduler.running) <= 2
    assert finished == 3 and peak > 0


@pytest.mark.model
def test_a_host_bound_too_small_for_one_request_is_refused(smollm2_dir):
    with pytest.raises(ValueError, match=r"--kv-host-memory-gb=.* holds 10 blocks .* 16 needed"):
        engine(smollm2_dir, kv_cache_memory_gb=0.2, kv_host_memory_gb=10.5 * HOST_PER_BLOCK / GIB)


@pytest.mark.model
def test_without_a_bound_the_device_budget_decides_and_the_log_says_unbounded(smollm2_dir, caplog):
    with caplog.at_level(logging.INFO, logger="refengine.model_runner"):
        eng = engine(smollm2_dir, num_kv_blocks=24)
    assert eng.runner.num_blocks == 24 and not eng.runner.host_bound
    line = next(m for m in caplog.messages if m.startswith("KV memory:"))
    assert "unbounded" in line and eng.stats().extra["kv_host_bytes_limit"] == 0
