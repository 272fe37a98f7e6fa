"""CI speed guard, as a ratio measured in one run (no absolute timings): a 50% SwiftKV prefill
must stay well under the baseline prefill of the same model. SmolLM2's shape with random
weights (``load_format="dummy"``: a prefill's cost does not depend on the values), the two
engines alternating; the ratio of each engine's fastest run (load from other tests only ever adds
time, so the minimum is the figure least moved by it: under CI's second worker the paired ratios
of one run spread from 0.39 to 4.9)."""

import json
import time

import pytest

from refengine.config import EngineConfig
from refengine.engine import LLMEngine
from refengine.sampling_params import SamplingParams

pytestmark = [pytest.mark.slow, pytest.mark.model]

TOKENS = 512
PAIRS = 7


def prefill_s(eng, rid: str) -> float:
    eng.add_request(rid, [(13 * i) % 40000 + 100 for i in range(TOKENS)], SamplingParams(max_tokens=1))
    t = time.perf_counter()
    while eng.has_unfinished():
        eng.step()
    return time.perf_counter() - t


def test_swiftkv_prefill_stays_well_under_baseline(smollm2_dir, tmp_path):
    cfg = json.loads((smollm2_dir / "config.json").read_text())
    L = cfg["num_hidden_layers"]
    cfg.update(model_type="llama_swiftkv", architectures=["LlamaSwiftKVForCausalLM"], swiftkv=True,
               num_key_value_layers=L // 2, key_value_group_size=1)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    kw = dict(model=str(tmp_path), load_format="dummy", max_model_len=1024, num_kv_blocks=80,
              max_num_batched_tokens=TOKENS, long_prefill_token_threshold=0, enable_prefix_caching=False)
    base, swift = LLMEngine(EngineConfig(swiftkv=False, **kw)), LLMEngine(EngineConfig(swiftkv=True, **kw))
    assert swift.runner.model.use_swiftkv and not base.runner.model.use_swiftkv
    prefill_s(base, "warm-b"), prefill_s(swift, "warm-s")
    pairs = [(prefill_s(swift, f"s{i}"), prefill_s(base, f"b{i}")) for i in range(PAIRS)]
    # FLOPs: about 0.5 of the baseline; 0.75 leaves room for noise and catches a lost speed-up
    assert min(s for s, _ in pairs) / min(b for _, b in pairs) < 0.75, pairs
