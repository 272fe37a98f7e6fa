"""Every registered KV method, on the real SmolLM2, with and without SwiftKV (AcrossKV g=2: a cache
slot shared by two layers) and with and without the FP8 codec:

- the engine serves (greedy generation runs to its length);
- bytes per token: what the pool really allocates equals the spec's arithmetic and /metrics' figure;
- a method's lossless setting (nothing dropped) gives the uncompressed engine's greedy tokens
  (FP8 on: it adds no error beyond FP8's own, checked on teacher-forced log-probs against the
  dense cache).

``CASES`` must name every method in ``refengine.kv.registry.METHODS``; a new method without a case
fails ``test_every_registered_method_has_a_case``.
"""

import pytest
import torch

from refengine.config import EngineConfig
from refengine.engine import LLMEngine
from refengine.kv import registry
from refengine.sampling_params import SamplingParams

pytestmark = [pytest.mark.slow, pytest.mark.model]

# method -> (lossless options or None, lossy options); "{cal}" is replaced by the layout's calibration.
CASES = {
    "zack": ({"calibration": "{cal}", "rate": 0.0}, {"calibration": "{cal}", "rate": 0.5}),
    "fp8": (None, {}),
}
PROMPTS = [[1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28],
           list(range(2000, 2037))]
GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


def test_every_registered_method_has_a_case():
    assert set(CASES) == set(registry.METHODS)


def options(template, cal):
    return {k: (str(cal) if v == "{cal}" else v) for k, v in template.items()}


def engine(model, methods=None, fp8=False):
    return LLMEngine(EngineConfig(model=str(model), max_model_len=256, num_kv_blocks=48, block_size=16,
                                  kv_methods=methods or {}, kv_cache_dtype="fp8_e4m3" if fp8 else "auto"))


def allocated_bytes_per_token(eng) -> int:
    kv = eng.runner.kv
    total = 0
    for slot in kv.slots:
        for part in slot.parts:
            for store in (part.k, part.v):
                total += sum(t.numel() * t.element_size() for t in vars(store).values() if torch.is_tensor(t))
    return total // (kv.num_blocks * kv.block_size)


@pytest.fixture(scope="module")
def models(smollm2_dir, acrosskv_dir):
    return {"base": smollm2_dir, "swiftkv": acrosskv_dir}


@pytest.fixture(scope="module")
def reference(models):
    """Greedy tokens and scores of the uncompressed engines, per (layout, fp8)."""
    out = {}
    for layout, model in models.items():
        for fp8 in (False, True):
            eng = engine(model, fp8=fp8)
            out[layout, fp8] = (eng.generate(PROMPTS, GREEDY), eng.score([(p[:8], p[8:]) for p in PROMPTS]),
                                eng.stats().kv_bytes_per_token)
    return out


@pytest.mark.parametrize("fp8", [False, True], ids=["dense", "fp8"])
@pytest.mark.parametrize("layout", ["base", "swiftkv"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_method_serves_and_counts_real_bytes(name, layout, fp8, models, zack_calibrations, reference):
    cal = zack_calibrations[layout]
    eng = engine(models[layout], {name: options(CASES[name][1], cal)}, fp8)
    out = eng.generate(PROMPTS, GREEDY)
    assert [len(o) for o in out] == [12, 12]
    stats = eng.stats()
    assert stats.kv_bytes_per_token == eng.runner.cache_spec.device_bytes_per_token == allocated_bytes_per_token(eng)
    assert stats.kv_bytes_per_token <= reference[layout, fp8][2]
    if name != "fp8" or not fp8:                  # a compressing method (or fp8 added) really saves bytes
        assert stats.kv_bytes_per_token < reference[layout, fp8][2]


@pytest.mark.parametrize("fp8", [False, True], ids=["dense", "fp8"])
@pytest.mark.parametrize("layout", ["base", "swiftkv"])
@pytest.mark.parametrize("name", sorted(n for n, c in CASES.items() if c[0] is not None))
def test_lossless_setting_equals_the_uncompressed_engine(name, layout, fp8, models, zack_calibrations, reference):
    eng = engine(models[layout], {name: options(CASES[name][0], zack_calibrations[layout])}, fp8)
    ref_tokens, ref_scores, _ = reference[layout, fp8]
    if not fp8:
        assert eng.generate(PROMPTS, GREEDY) == ref_tokens
    else:                                          # FP8 rounding differs in a rotated basis
        dense_scores = reference[layout, False][1]

        def err(scores):
            d = [abs(a[0] - b[0]) for sa, sb in zip(scores, dense_scores) for a, b in zip(sa, sb)]
            return sum(d) / len(d)

        got, fp8_alone = err(eng.score([(p[:8], p[8:]) for p in PROMPTS])), err(ref_scores)
        assert got <= 1.5 * fp8_alone + 0.02, (got, fp8_alone)
