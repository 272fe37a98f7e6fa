"""Prompt logprobs from the prefill pass, and logit_bias in the sampler, on the real SmolLM2.

Prompt logprobs must equal a full transformers forward (baseline) and the engine's own
``score()`` (continuation tokens teacher-forced as decode steps through the cache), under
chunked prefill, in mixed batches, with prefix caching on, and for a SwiftKV checkpoint
(whose prompt rows then run the later layers too)."""

import pytest
import torch

from modelkit.swiftkv import write_swiftkv_checkpoint
from refengine.config import EngineConfig
from refengine.engine import LLMEngine
from refengine.sampling_params import SamplingParams

pytestmark = [pytest.mark.slow, pytest.mark.model]

torch.manual_seed(0)
PROMPT = torch.randint(100, 30000, (53,)).tolist()
OTHER = torch.randint(100, 30000, (37,)).tolist()


def make(model_dir, **kw):
    kw.setdefault("num_kv_blocks", 128)
    kw.setdefault("block_size", 8)
    kw.setdefault("max_num_batched_tokens", 24)          # chunked prefill: 53 tokens take 3+ steps
    return LLMEngine(EngineConfig(model=str(model_dir), max_model_len=256, **kw))


def run(eng, prompts, params):
    """-> per request: (output token ids, prompt_logprobs of the first increment)."""
    ids = [f"r{i}" for i in range(len(prompts))]
    for rid, p, sp in zip(ids, prompts, params):
        eng.add_request(rid, p, sp)
    toks, plps = {rid: [] for rid in ids}, {}
    while eng.has_unfinished():
        for out in eng.step():
            toks[out.request_id] += out.new_token_ids
            if out.prompt_logprobs is not None:
                assert out.request_id not in plps and out.num_output_tokens == 1
                plps[out.request_id] = out.prompt_logprobs
    return [toks[r] for r in ids], [plps.get(r) for r in ids]


def check_against_score(eng, prompt, plp):
    score = eng.score([(prompt[:1], prompt[1:])])[0]
    assert plp[0] is None and len(plp) == len(prompt)
    diffs = [abs(e.logprob - s[0]) for e, s in zip(plp[1:], score)]
    assert max(diffs) < 1e-3, max(diffs)


@pytest.fixture(scope="module")
def base(smollm2_dir):
    return make(smollm2_dir)


def test_prompt_logprobs_match_transformers_and_score(base, smollm2_dir):
    from transformers import AutoModelForCausalLM

    greedy = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    (plain,), _ = run(base, [PROMPT], [greedy])
    (toks,), (plp,) = run(base, [PROMPT], [SamplingParams(max_tokens=3, temperature=0, ignore_eos=True,
                                                          prompt_logprobs=4, prompt_logprob_ranks=True)])
    assert toks == plain                                   # asking changes nothing else
    hf = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([PROMPT])).logits[0].float(), -1)
    for p in range(1, len(PROMPT)):
        e, row = plp[p], ref[p - 1]
        assert e.token_id == PROMPT[p]
        assert abs(e.logprob - float(row[PROMPT[p]])) < 1e-3
        t = float(row[PROMPT[p]])              # rank: 1 + tokens more likely (ties within float noise either way)
        assert int((row > t + 1e-4).sum()) + 1 <= e.rank <= int((row > t - 1e-4).sum()) + 1
        assert len(e.top) == 4 and e.top[0][0] == int(row.argmax())
        assert [v for _, v in e.top] == sorted((v for _, v in e.top), reverse=True)
    check_against_score(base, PROMPT, plp)
    assert base.block_manager.num_used == 0


def test_mixed_batch_and_prefix_cache(base):
    greedy = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    want = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True, prompt_logprobs=0)
    (alone_other,), _ = run(base, [OTHER], [greedy])
    run(base, [PROMPT], [greedy])                          # PROMPT's blocks are now in the prefix cache
    (t_a, t_b), (p_a, p_b) = run(base, [PROMPT, OTHER], [want, greedy])
    assert p_b is None and t_b == alone_other
    assert len(p_a) == len(PROMPT) and all(e.top == [] and e.rank is None for e in p_a[1:])    # no ranks asked
    check_against_score(base, PROMPT, p_a)                 # every position computed despite the cache hit


def test_one_token_prompt_and_validation(base):
    (_,), (plp,) = run(base, [[PROMPT[0]]], [SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=2)])
    assert plp == [None]
    with pytest.raises(ValueError, match="logit_bias"):
        base.add_request("bad", PROMPT, SamplingParams(logit_bias=((10**6, 1.0),)))


def test_swiftkv_prompt_rows_run_the_later_layers(smollm2_dir, tmp_path):
    ckpt = write_swiftkv_checkpoint(smollm2_dir, tmp_path / "l15", 15, 1)
    eng = make(ckpt)
    greedy = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    (plain,), _ = run(eng, [PROMPT], [greedy])
    (toks, other), (plp, _) = run(eng, [PROMPT, OTHER], [SamplingParams(max_tokens=3, temperature=0, ignore_eos=True,
                                                                       prompt_logprobs=1), greedy])
    assert toks == plain
    check_against_score(eng, PROMPT, plp)


def test_logit_bias_batched(base):
    (natural,), _ = run(base, [PROMPT], [SamplingParams(max_tokens=1, temperature=0)])
    forced, banned = 1234, natural[0]
    params = [SamplingParams(max_tokens=2, temperature=0, ignore_eos=True, logit_bias=((forced, 100.0),), logprobs=1),
              SamplingParams(max_tokens=1, temperature=0, logit_bias=((banned, -100.0),)),
              SamplingParams(max_tokens=1, temperature=0.8, seed=3, logit_bias=((forced, 100.0),))]
    outs, _ = run(base, [PROMPT, PROMPT, OTHER], params)
    assert outs[0] == [forced, forced] and outs[2] == [forced]
    assert outs[1][0] != banned
