"""The shipped distilled SwiftKV tensors join the prepared base model into a servable
checkpoint (real model). The 50% SwiftKV variant still answers a question the original
answers; the AcrossKV g=2 variant does not (see docs/swiftkv.md), so for it only the
smaller KV footprint is checked."""

import pytest

from modelkit.corpus import chat_ids
from modelkit.shipped import materialize, names
from refengine.config import EngineConfig
from refengine.engine import LLMEngine
from refengine.sampling_params import SamplingParams

pytestmark = [pytest.mark.slow, pytest.mark.model]


def _engine(model_dir):
    return LLMEngine(EngineConfig(model=str(model_dir), max_model_len=256))


def test_shipped_swiftkv_answers_like_the_original():
    from transformers import AutoTokenizer

    assert "SmolLM2-135M-Instruct-SwiftKV" in names()
    ckpt = materialize("SmolLM2-135M-Instruct-SwiftKV")
    tok = AutoTokenizer.from_pretrained(ckpt)
    ids = chat_ids(tok, [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True)
    (out,) = _engine(ckpt).generate([ids], SamplingParams(max_tokens=16, temperature=0))
    assert "Paris" in tok.decode(out, skip_special_tokens=True)


@pytest.mark.parametrize("name,l", [("SmolLM2-135M-Instruct-SwiftKV-25pct", 22), ("SmolLM2-135M-Instruct-SwiftKV-13pct", 26),
                                    ("SmolLM2-135M-Instruct-SwiftKV-10pct", 27)])
def test_shipped_quality_first_swiftkv_answers_like_the_original(name, l):
    from transformers import AutoTokenizer

    assert name in names()
    ckpt = materialize(name)
    assert f'"num_key_value_layers": {l}' in (ckpt / "config.json").read_text()
    tok = AutoTokenizer.from_pretrained(ckpt)
    ids = chat_ids(tok, [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True)
    (out,) = _engine(ckpt).generate([ids], SamplingParams(max_tokens=16, temperature=0))
    assert "Paris" in tok.decode(out, skip_special_tokens=True)


def test_shipped_acrosskv_uses_less_kv(smollm2_dir):
    assert "SmolLM2-135M-Instruct-SwiftKV-AcrossKV2" in names()
    across = _engine(materialize("SmolLM2-135M-Instruct-SwiftKV-AcrossKV2")).stats().kv_bytes_per_token
    assert across < _engine(smollm2_dir).stats().kv_bytes_per_token


def test_shipped_zack_answers_like_the_original_with_a_smaller_cache(smollm2_dir):
    from transformers import AutoTokenizer

    assert "SmolLM2-135M-Instruct-ZACK" in names()
    ckpt = materialize("SmolLM2-135M-Instruct-ZACK")
    tok = AutoTokenizer.from_pretrained(ckpt)
    ids = chat_ids(tok, [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True)
    eng = _engine(ckpt)
    (out,) = eng.generate([ids], SamplingParams(max_tokens=16, temperature=0))
    assert "Paris" in tok.decode(out, skip_special_tokens=True)
    assert eng.stats().kv_bytes_per_token < _engine(smollm2_dir).stats().kv_bytes_per_token
