"""refengine.graph_decode: decode steps from static, padded buffers equal the ordinary steps.

On CUDA those buffers are what a captured graph replays (tests/gpu captures them); here on CPU the
same static path runs eagerly (``capture=False``): the engine is told the device qualifies
(``graph_decode.eligible`` patched; everything after it is the engine's own code), and the same
requests run with and without it on the real SmolLM2, with a request arriving mid-run so that
mixed steps (eager) and pure-decode steps (static; batches of 2 and 3 padded to 2 and 4 rows,
their tables padded to power-of-two widths) alternate."""

import pytest
import torch
from engine_support import logprobs, run_with_arrival, tokens

from modelkit.swiftkv import write_swiftkv_checkpoint
from refengine import graph_decode
from refengine.config import EngineConfig
from refengine.engine import LLMEngine
from refengine.sampling_params import SamplingParams

PARAMS = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True, logprobs=2)
PROMPTS = [[1, 2, 3, 400 + i] * (4 + 9 * i) for i in range(3)]


def run(monkeypatch, model_dir, static: bool, **kw):
    """(tokens and log-probs per request, the engine)."""
    if static:
        monkeypatch.setattr(graph_decode, "eligible", lambda *a: None)
    eng = LLMEngine(EngineConfig(model=str(model_dir), max_model_len=512, num_kv_blocks=128, **kw))
    monkeypatch.undo()
    got = run_with_arrival(eng, PROMPTS, PARAMS)
    return got, eng


@pytest.mark.parametrize("kw", [dict(dtype="float32"), dict(dtype="bfloat16"),
                                dict(dtype="bfloat16", load_format="gguf")], ids=["f32", "bf16", "q4_1"])
def test_static_decode_is_bit_equal_with_the_cpp_kernel(monkeypatch, smollm2_dir, kw):
    fast, eng = run(monkeypatch, smollm2_dir, True, **kw)
    slow, plain = run(monkeypatch, smollm2_dir, False, **kw)
    assert eng.runner.graphs is not None and plain.runner.graphs is None
    assert eng.runner.graphs.replays >= 15          # most of the ~24 steps ran the static path
    assert eng.runner.graphs.sizes[:3] == [1, 2, 4]
    assert fast == slow


@pytest.mark.parametrize("kw", [dict(decode_kernel="torch"), dict(dtype="bfloat16", kv_cache_dtype="fp8_e4m3")],
                         ids=["gather-sdpa", "fp8-kv"])
def test_static_decode_over_gathered_blocks_matches(monkeypatch, smollm2_dir, kw):
    """The path CUDA takes: gathered blocks of the padded table width under the lengths' mask (SDPA
    sums over masked keys too, so close rather than bit-equal)."""
    fast, eng = run(monkeypatch, smollm2_dir, True, **kw)
    slow, _ = run(monkeypatch, smollm2_dir, False, **kw)
    assert eng.runner.graphs.replays >= 15 and tokens(fast) == tokens(slow)
    assert torch.allclose(torch.tensor(logprobs(fast)), torch.tensor(logprobs(slow)), atol=2e-3)


def test_swiftkv_tail_runs_inside_the_static_step(monkeypatch, smollm2_dir, tmp_path):
    ckpt = write_swiftkv_checkpoint(smollm2_dir, tmp_path / "l15g2", 15, 2)
    fast, eng = run(monkeypatch, ckpt, True, dtype="bfloat16")
    slow, _ = run(monkeypatch, ckpt, False, dtype="bfloat16")
    assert eng.runner.model.use_swiftkv and eng.runner.graphs.replays >= 15 and fast == slow


def test_the_scratch_block_is_outside_the_managers_blocks(monkeypatch, smollm2_dir):
    _, eng = run(monkeypatch, smollm2_dir, True)
    r = eng.runner
    assert eng.block_manager.num_blocks == r.num_blocks == 127 and r.graphs.scratch == 127
    assert r.kv.group_blocks == [128]                 # the same memory as without graphs


def test_who_gets_graphs():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert graph_decode.eligible([], [None], cuda, True) is None
    assert "enforce_eager" in graph_decode.eligible([], [None], cuda, False)
    assert "CUDA" in graph_decode.eligible([], [None], cpu, True)
    assert "sliding" in graph_decode.eligible([], [None, 512], cuda, True)

    class KCache:
        name = "kcache"
    assert "kcache" in graph_decode.eligible([KCache()], [None], cuda, True)


def test_sizes_and_widths():
    assert graph_decode.capture_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert graph_decode.capture_sizes(3) == [1, 2, 3] and graph_decode.capture_sizes(1) == [1]
    assert graph_decode.width_buckets(32) == [1, 2, 4, 8, 16, 32]
    assert graph_decode.width_buckets(40) == [1, 2, 4, 8, 16, 32, 40] and graph_decode.width_buckets(1) == [1]
