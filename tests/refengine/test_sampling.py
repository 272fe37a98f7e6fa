"""Sampling behaviour on the real model: seeds, top-k/p, stop ids, min_tokens, logprobs, penalties."""

import math

import pytest

from refengine.config import EngineConfig
from refengine.engine import LLMEngine
from refengine.sampling_params import SamplingParams

pytestmark = [pytest.mark.slow, pytest.mark.model]

CHAT = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407,
        19712, 8182, 2, 198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198]
TEXT = [504, 3575, 282, 4649, 314]


@pytest.fixture(scope="module")
def eng(smollm2_dir):
    return LLMEngine(EngineConfig(model=str(smollm2_dir), max_model_len=512, num_kv_blocks=256))


def test_seed_is_reproducible_whatever_the_batch(eng):
    p = SamplingParams(max_tokens=16, temperature=1.0, seed=1234, ignore_eos=True)
    alone = eng.generate([TEXT], p)[0]
    other = SamplingParams(max_tokens=16, temperature=1.0, ignore_eos=True)
    batched = eng.generate([CHAT, TEXT, TEXT], [other, p, other])[1]
    assert alone == batched
    assert eng.generate([TEXT], SamplingParams(max_tokens=16, temperature=1.0, seed=99, ignore_eos=True))[0] != alone


def test_top_k_1_and_tiny_top_p_equal_greedy(eng):
    greedy = eng.generate([TEXT], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))[0]
    assert eng.generate([TEXT], SamplingParams(max_tokens=12, temperature=1.5, top_k=1, ignore_eos=True))[0] == greedy
    assert eng.generate([TEXT], SamplingParams(max_tokens=12, temperature=1.0, top_p=1e-6, ignore_eos=True))[0] == greedy


def test_eos_stop_ids_and_min_tokens(eng):
    out = eng.generate([CHAT], SamplingParams(max_tokens=64, temperature=0))[0]
    assert out[-1] == 2 and len(out) < 64                       # "The capital of France is Paris.<|im_end|>"
    forced = eng.generate([CHAT], SamplingParams(max_tokens=64, temperature=0, min_tokens=len(out) + 5))[0]
    assert 2 not in forced[:len(out) + 5] and len(forced) >= len(out) + 5
    stop_at = out[2]
    eng.add_request("s", CHAT, SamplingParams(max_tokens=64, temperature=0, stop_token_ids=(stop_at,)))
    last = None
    while eng.has_unfinished():
        for o in eng.step():
            last = o
    assert last.finish_reason == "stop" and last.stop_reason == stop_at and last.num_output_tokens == 3


def test_logprobs(eng):
    eng.add_request("lp", TEXT, SamplingParams(max_tokens=4, temperature=0, logprobs=5, ignore_eos=True))
    lps = []
    while eng.has_unfinished():
        for o in eng.step():
            lps += o.new_logprobs
    assert len(lps) == 4
    for lp in lps:
        assert len(lp.top) == 5 and lp.logprob <= 0
        assert lp.top[0][0] == lp.token_id and math.isclose(lp.top[0][1], lp.logprob, abs_tol=1e-6)
        assert [v for _, v in lp.top] == sorted((v for _, v in lp.top), reverse=True)


def test_penalties_change_repetitive_output(eng):
    prompt = [504, 504, 504, 504, 504, 504]
    base = eng.generate([prompt], SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))[0]
    rep = eng.generate([prompt], SamplingParams(max_tokens=16, temperature=0, ignore_eos=True,
                                                repetition_penalty=2.0))[0]
    freq = eng.generate([prompt], SamplingParams(max_tokens=16, temperature=0, ignore_eos=True,
                                                 frequency_penalty=2.0))[0]
    assert rep != base and freq != base
    assert len(set(freq)) >= len(set(base))


def test_abort_frees_everything(eng):
    eng.add_request("x", TEXT, SamplingParams(max_tokens=50))
    eng.step()
    out = eng.abort_request("x")
    assert out.finished and out.finish_reason == "abort"
    assert eng.block_manager.num_used == 0 and not eng.has_unfinished()
