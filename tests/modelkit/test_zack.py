"""``modelkit zack-calibrate`` on the real SmolLM2 (few tokens: mechanics, not quality): a servable
ZACK directory (the ``zack_dir`` fixture, tests/conftest.py) whose per-head ranks size the real KV
pool, re-planned by --kv-methods."""

import json

import pytest

from refengine.config import EngineConfig
from refengine.engine import LLMEngine
from refengine.sampling_params import SamplingParams

pytestmark = [pytest.mark.slow, pytest.mark.model]


def test_calibration_files_and_served_ranks(zack_dir):
    cal = json.loads((zack_dir / "zack.json").read_text())
    assert cal["format"] == "swiftserve-zack" and cal["calibration"]["tokens"] >= 1024
    assert len(cal["slots"]) == 30 and all(len(s["s_qk"]) == 3 and len(s["s_qk"][0]) == 64 for s in cal["slots"])
    for s in cal["slots"]:                            # singular values descend
        assert all(row == sorted(row, reverse=True) for row in s["s_qk"] + s["s_vo"])
    z = json.loads((zack_dir / "config.json").read_text())["zack"]
    assert z["mode"] == "adaptive" and 0.5 <= z["rate"] < 0.52
    assert len(z["k_ranks"]) == 30 and len({r for row in z["k_ranks"] + z["v_ranks"] for r in row}) > 1  # adaptive
    index = json.loads((zack_dir / "model.safetensors.index.json").read_text())["weight_map"]
    assert not any("zack" in name for name in index)  # rotations stay out of the weight index


def test_pool_is_sized_by_the_per_head_ranks(zack_dir):
    eng = LLMEngine(EngineConfig(model=str(zack_dir), max_model_len=256, kv_cache_memory_gb=0.05))
    z = json.loads((zack_dir / "config.json").read_text())["zack"]
    kept = sum(sum(k) + sum(v) for k, v in zip(z["k_ranks"], z["v_ranks"]))
    stats = eng.stats()
    assert stats.kv_bytes_per_token == kept * 4                       # float32, no padding to the maximum
    max_rank = max(r for row in z["k_ranks"] + z["v_ranks"] for r in row)
    assert stats.kv_bytes_per_token < 30 * 3 * 2 * max_rank * 4
    assert stats.extra["zack_rate"] == pytest.approx(z["rate"], abs=1e-6)
    # the same budget holds ~2x the tokens of the uncompressed model
    assert stats.kv_blocks_total >= 1.9 * (0.05 * (1 << 30) // (16 * stats.kv_bytes_per_token_baseline))
    out = eng.generate([[1, 504, 3575, 282, 4649, 314]], SamplingParams(max_tokens=8, temperature=0))
    assert len(out[0]) >= 1
    # --kv-methods re-plans the ranks from the stored singular values
    uni = LLMEngine(EngineConfig(model=str(zack_dir), max_model_len=256, num_kv_blocks=32,
                                 kv_methods={"zack": {"rate": 0.25, "mode": "uniform"}}))
    assert uni.stats().kv_bytes_per_token == 30 * 3 * 2 * 48 * 4

