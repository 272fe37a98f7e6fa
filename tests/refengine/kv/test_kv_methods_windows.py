"""KV methods on a sliding-window family: a tiny random Gemma 3 (interleaved 24-token windows and a
global layer, SmolLM2's tokenizer so that ``modelkit zack-calibrate`` can read text), calibrated
for ZACK through the CLI, then served with ZACK, the fp8 codec and KCache composed on top, while
the windowed layers keep freeing their blocks. Eviction and ZipCache refuse it with a reason."""

import shutil

import pytest
import torch

from refengine.config import EngineConfig
from refengine.engine import LLMEngine
from refengine.kv import registry
from refengine.sampling_params import SamplingParams

pytestmark = [pytest.mark.slow, pytest.mark.model]


@pytest.fixture(scope="module")
def gemma_zack(smollm2_dir, tmp_path_factory):
    import transformers as tf

    from modelkit.cli import main as modelkit_main

    torch.manual_seed(0)
    cfg = tf.Gemma3TextConfig(vocab_size=49152, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=64, sliding_window=24,
                              max_position_embeddings=512, layer_types=["sliding_attention", "full_attention",
                                                                        "sliding_attention"])
    root = tmp_path_factory.mktemp("gemma-windows")
    base = root / "base"
    tf.Gemma3ForCausalLM(cfg).save_pretrained(base)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy2(smollm2_dir / f, base / f)
    out = root / "zack"
    assert modelkit_main(["zack-calibrate", "--model", str(base), "--output", str(out), "--tokens", "1024",
                          "--seq-len", "128", "--batch", "8", "--rate", "0.25"]) == 0
    return base, out


def logprobs(model, prompt, **kw):
    eng = LLMEngine(EngineConfig(model=str(model), max_model_len=256, num_kv_blocks=64, block_size=8,
                                 max_num_batched_tokens=32, **kw))
    rows = eng.score([(prompt[:8], prompt[8:])], want_dist=True)[0]
    return torch.stack([r[2] for r in rows]), eng


def test_zack_fp8_kcache_compose_with_windows(gemma_zack):
    base, zack = gemma_zack
    prompt = torch.randint(3, 49152, (80,), generator=torch.Generator().manual_seed(1)).tolist()
    ref, eng = logprobs(base, prompt)
    assert eng.stats().extra["kv_window_blocks_freed"] > 0
    full, _ = logprobs(zack, prompt, kv_methods={"zack": {"rate": 0.0}})       # full rank: the same model
    assert (full - ref).abs().max() < 1e-3
    z, zeng = logprobs(zack, prompt)                                           # its served rate (0.25)
    assert zeng.stats().kv_bytes_per_token < 0.8 * eng.stats().kv_bytes_per_token
    # KCache with top_n >= the context attends to every token: same as ZACK alone.
    zk, keng = logprobs(zack, prompt, kv_methods={"kcache": {"top_n": 512, "device_layers": 1}})
    assert (zk - z).abs().max() < 1e-4 and keng.stats().extra["kcache_v_rows_fetched"] > 0
    z8, eng8 = logprobs(zack, prompt, kv_cache_dtype="fp8_e4m3", kv_methods={"kcache": {"top_n": 16}})
    assert eng8.stats().kv_bytes_per_token < zeng.stats().kv_bytes_per_token / 3
    assert eng8.stats().extra["kv_window_blocks_freed"] > 0
    assert torch.isfinite(z8).all() and (z8.exp().sum(-1) - 1).abs().max() < 1e-3
    got = eng8.generate([prompt[:20]], SamplingParams(max_tokens=8, temperature=0))
    assert len(got[0]) == 8


@pytest.mark.parametrize("method", ["eviction", "zipcache"])
def test_methods_that_follow_the_global_table_refuse_windows(gemma_zack, method):
    base, _ = gemma_zack
    reason = registry.check({method: {}}, base)
    assert reason and "sliding-window" in reason
