"""refengine.decode_stack: a pure-decode step's layers in one C++ call are bit-equal to the Python layers.

Each case runs the same requests twice on the real SmolLM2, the C++ layer loop on and off
(``SWIFTSERVE_DECODE_STACK``), with a request arriving mid-run so that mixed prefill + decode steps
(the Python layers) and pure-decode steps (the loop) alternate: the tokens and every log-probability
must be equal, not close."""

import pytest
from engine_support import run_with_arrival

from modelkit.swiftkv import write_swiftkv_checkpoint
from refengine.config import EngineConfig
from refengine.engine import LLMEngine
from refengine.sampling_params import SamplingParams

PARAMS = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True, logprobs=2)
PROMPTS = [[1, 2, 3, 400 + i] * (4 + 9 * i) for i in range(3)]


def run(monkeypatch, model_dir, on: bool, **kw):
    """(tokens and log-probs per request, whether the loop was built for the cache)."""
    monkeypatch.setenv("SWIFTSERVE_DECODE_STACK", "1" if on else "0")
    eng = LLMEngine(EngineConfig(model=str(model_dir), max_model_len=512, num_kv_blocks=128, **kw))
    got = {r: [(t, repr(lp)) for t, lp in steps] for r, steps in run_with_arrival(eng, PROMPTS, PARAMS).items()}
    return got, eng.runner.model._stack is not None


@pytest.mark.parametrize("kw", [dict(dtype="bfloat16"), dict(dtype="bfloat16", load_format="gguf"),
                                dict(dtype="float32", load_format="gguf")], ids=["bf16", "q4_1-bf16", "q4_1-f32"])
def test_decode_stack_is_bit_equal_to_the_python_layers(monkeypatch, smollm2_dir, kw):
    fast, used = run(monkeypatch, smollm2_dir, True, **kw)
    slow, unused = run(monkeypatch, smollm2_dir, False, **kw)
    assert used and not unused
    assert fast == slow


def test_swiftkv_earlier_layers_take_the_loop_and_stay_equal(monkeypatch, smollm2_dir, tmp_path):
    ckpt = write_swiftkv_checkpoint(smollm2_dir, tmp_path / "l15g2", 15, 2)
    fast, used = run(monkeypatch, ckpt, True, dtype="bfloat16")
    slow, _ = run(monkeypatch, ckpt, False, dtype="bfloat16")
    assert used and fast == slow


@pytest.mark.parametrize("kw", [dict(dtype="bfloat16", kv_cache_dtype="fp8_e4m3"),
                                dict(dtype="float32"),
                                dict(dtype="bfloat16", fused_ops="torch")], ids=["fp8-kv", "float32", "torch-ops"])
def test_what_the_loop_does_not_cover_keeps_the_python_layers(monkeypatch, smollm2_dir, kw):
    got, used = run(monkeypatch, smollm2_dir, True, **kw)
    assert not used and sorted(got) == ["r0", "r1", "r2"]
