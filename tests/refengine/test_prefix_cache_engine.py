"""Prefix caching on the real SmolLM2: the same greedy tokens with the cache on and off, the
cache really hit (vLLM's query/hit counters), on the baseline and on SwiftKV with AcrossKV and
FP8 (the layouts share blocks by the same chain); scoring through the cache is unchanged."""

import pytest

from refengine.config import EngineConfig
from refengine.engine import LLMEngine
from refengine.sampling_params import SamplingParams

pytestmark = [pytest.mark.slow, pytest.mark.model]

SHARED = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28] + list(range(3000, 3030))
PROMPTS = [SHARED + [504, 3575, 282], SHARED + [4649, 314], SHARED + list(range(1000, 1021)), SHARED[:20]]
GREEDY = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)


def engine(model, caching, **kw):
    return LLMEngine(EngineConfig(model=str(model), max_model_len=256, num_kv_blocks=64, block_size=8,
                                  enable_prefix_caching=caching, **kw))


def serve(eng):
    """The first prompt alone (fills the cache), then the others in one batch, then a repeat."""
    first = eng.generate(PROMPTS[:1], GREEDY)
    rest = eng.generate(PROMPTS[1:], GREEDY)
    again = eng.generate(PROMPTS[:2], GREEDY)
    return first + rest + again


@pytest.fixture(scope="module")
def acrosskv(smollm2_dir, tmp_path_factory):
    from modelkit.swiftkv import write_swiftkv_checkpoint

    return write_swiftkv_checkpoint(smollm2_dir, tmp_path_factory.mktemp("pc") / "l15g2", 15, 2)


@pytest.mark.parametrize("layout,kw", [("base", {}), ("swiftkv", {}), ("swiftkv", {"kv_cache_dtype": "fp8_e4m3"})],
                         ids=["baseline", "swiftkv-acrosskv", "swiftkv-acrosskv-fp8"])
def test_cached_and_uncached_greedy_tokens_are_identical(smollm2_dir, acrosskv, layout, kw):
    model = smollm2_dir if layout == "base" else acrosskv
    off = engine(model, False, **kw)
    on = engine(model, True, **kw)
    assert serve(on) == serve(off)
    s_on, s_off = on.stats(), off.stats()
    assert s_on.prefix_caching and not s_off.prefix_caching
    assert s_off.prefix_cache_hits == 0
    # shared 44 tokens = 5 blocks of 8 for each of the 4 later prompts sharing it, at least
    assert s_on.prefix_cache_hits >= 4 * 40
    assert s_on.prefix_cache_queries == sum(len(p) for p in PROMPTS + PROMPTS[:2])
    assert on.block_manager.num_free == on.block_manager.num_blocks      # nothing leaked


def test_scoring_through_cached_prefixes_is_unchanged(smollm2_dir):
    items = [(SHARED, [504, 3575, 282, 4649]), (SHARED + [7], [314, 28])]
    on, off = engine(smollm2_dir, True), engine(smollm2_dir, False)
    on.generate([SHARED + [11]], SamplingParams(max_tokens=1))          # warm the cache
    got, ref = on.score(items), off.score(items)
    assert [[t[1] for t in row] for row in got] == [[t[1] for t in row] for row in ref]
    assert all(abs(a[0] - b[0]) < 1e-3 for ra, rb in zip(got, ref) for a, b in zip(ra, rb))
    assert on.stats().prefix_cache_hits > 0
