"""Speculative decoding on the real SmolLM2 (float32: bf16 greedy depends on the batch shape), with the
same engine serving each request with and without drafting (``SamplingParams.speculative``):

- greedy tokens are identical with speculation on and off, drafts really were accepted, and fewer
  steps were needed; on the baseline, on SwiftKV with AcrossKV (drafted tokens run every layer: their
  logits would differ otherwise), on each KV method that verifies drafts (KCache, eviction, ZACK; FP8
  identical up to the first near-tie, see NEAR_TIE), with chunked prefill (a step budget smaller than
  the prompts) and prefix caching;
- ZipCache is refused by name; the pool has every block back after serving;
- logprobs, n > 1 (copies of one prompt in one batch), structured outputs (JSON schema: the grammar
  masks every draft position, the one after a draft that ends it allows only EOS), a continuation (prompt + tokens generated elsewhere) that resumes
  with drafting, and seeded sampling (reproducible with speculation on).
"""

import copy
import json
from dataclasses import replace

import pytest

from refengine.config import EngineConfig
from refengine.engine import LLMEngine
from refengine.sampling_params import SamplingParams
from refengine.structured.spec import StructuredSpec

pytestmark = [pytest.mark.slow, pytest.mark.model]

PASSAGE = ("Redistribution and use in source and binary forms, with or without modification, are permitted "
           "provided that the following conditions are met: Redistributions of source code must retain the "
           "above copyright notice, this list of conditions and the following disclaimer. Redistributions in "
           "binary form must reproduce the above copyright notice, this list of conditions and the following "
           "disclaimer in the documentation and/or other materials provided with the distribution.")
CODE = ("def moving_average(values, window):\n    if window <= 0:\n        raise ValueError('window must be "
        "positive')\n    out = []\n    total = 0.0\n    for i, v in enumerate(values):\n        total += v\n"
        "        if i >= window:\n            total -= values[i - window]\n        out.append(total / min(i + 1, "
        "window))\n    return out\n")
GREEDY = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
SPEC = {"method": "suffix", "num_speculative_tokens_per_batch_size": [[1, 8, 12]]}


def chat_ids(tok, text: str) -> list[int]:
    text = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
    return tok.encode(text, add_special_tokens=False)


@pytest.fixture(scope="module")
def tok(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="module")
def prompts(tok):
    chat = lambda text: chat_ids(tok, text)  # noqa: E731
    return [chat("Repeat this text exactly, word for word:\n\n" + PASSAGE),
            chat("Rename the function to `rolling_mean` and return the whole code:\n\n" + CODE)]


@pytest.fixture(scope="module")
def acrosskv(smollm2_dir, tmp_path_factory):
    from modelkit.swiftkv import write_swiftkv_checkpoint

    return write_swiftkv_checkpoint(smollm2_dir, tmp_path_factory.mktemp("spec") / "l15g2", 15, 2)


def engine(model, **kw):
    kw = {"max_model_len": 1024, "num_kv_blocks": 96, "block_size": 16, "max_num_batched_tokens": 128,
          "speculative_config": SPEC, "dtype": "float32", **kw}
    return LLMEngine(EngineConfig(model=str(model), **kw))


def run(eng, prompts, params):
    """Outputs of ``prompts`` (one batch) and, per request, how many increments (steps with tokens) it took."""
    ids = [f"r{i}-{id(params)}-{eng.generation_tokens_total}" for i in range(len(prompts))]
    for rid, p in zip(ids, prompts):
        eng.add_request(rid, p, params)
    out = {rid: [] for rid in ids}
    lps = {rid: [] for rid in ids}
    steps = {rid: 0 for rid in ids}
    while eng.has_unfinished():
        for o in eng.step():
            out[o.request_id] += o.new_token_ids
            lps[o.request_id] += o.new_logprobs or []
            steps[o.request_id] += 1
    assert not eng.take_failures()
    return [out[r] for r in ids], [lps[r] for r in ids], [steps[r] for r in ids]


def on_off(eng, prompts, params=GREEDY):
    off = run(eng, prompts, replace(params, speculative=False))
    accepted = eng.drafter.num_accepted_tokens
    on = run(eng, prompts, replace(params, speculative=True))
    return off, on, eng.drafter.num_accepted_tokens - accepted


CASES = {
    "baseline": ("base", {}),
    "swiftkv-acrosskv": ("swiftkv", {}),
    "fp8": ("base", {"kv_cache_dtype": "fp8_e4m3"}),
    "kcache": ("base", {"kv_methods": {"kcache": {"top_n": 8, "device_layers": 2}}}),
    "eviction": ("base", {"kv_methods": {"eviction": {"budget": 64, "window": 8}}}),
    "zack": ("zack", {}),
}


# FP8 rounds each stored K/V element to 3 mantissa bits: a float32 rounding difference between a
# one-row decode step and a verify step (attention over gathered blocks: other matrix shapes) can
# move an element across an fp8 rounding boundary, a change of a few hundredths of a nat in the
# logits. Its greedy tokens may therefore part where the run without drafts chose between two
# tokens less than NEAR_TIE nats apart (measured: 0.033), and nowhere else.
NEAR_TIE = 0.1
PARTS_AT_NEAR_TIES = {"fp8"}


def first_part(off, on, off_lps):
    """(request, position, top-2 margin of the run without drafts) where ``on`` first leaves ``off``."""
    for r, (a, b) in enumerate(zip(off, on)):
        i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if i is not None:
            top = off_lps[r][i].top
            return r, i, top[0][1] - top[1][1]
    return None


@pytest.mark.parametrize("case", sorted(CASES))
def test_greedy_tokens_identical_with_and_without_speculation(case, smollm2_dir, acrosskv, zack_dir, prompts):
    layout, kw = CASES[case]
    model = {"base": smollm2_dir, "swiftkv": acrosskv, "zack": zack_dir}[layout]
    eng = engine(model, **kw)
    (off, off_lps, steps_off), (on, _, steps_on), accepted = on_off(eng, prompts, replace(GREEDY, logprobs=2))
    if case in PARTS_AT_NEAR_TIES:
        part = first_part(off, on, off_lps)
        assert part is None or part[2] < NEAR_TIE, f"parted at a confident token: {part}"
    else:
        assert on == off
    assert accepted > 0 and sum(steps_on) < sum(steps_off)
    assert eng.block_manager.num_free == eng.block_manager.num_blocks       # rejected drafts' blocks came back


def test_zipcache_is_refused_by_name(smollm2_dir):
    with pytest.raises(ValueError, match="KV method 'zipcache'"):
        engine(smollm2_dir, kv_methods={"zipcache": {}})


@pytest.fixture(scope="module")
def base(smollm2_dir):
    return engine(smollm2_dir)


def test_prefix_caching_n_copies_and_logprobs(base, prompts):
    params = replace(GREEDY, logprobs=2)
    (off, off_lps, _), (on, on_lps, _), accepted = on_off(base, [prompts[0]] * 2 + [prompts[1]], params)
    assert on == off and on[0] == on[1] and accepted > 0
    for a_req, b_req in zip(off_lps, on_lps):
        assert [lp.token_id for lp in a_req] == [lp.token_id for lp in b_req]
        assert all(abs(a.logprob - b.logprob) < 1e-3 and [t for t, _ in a.top] == [t for t, _ in b.top]
                   for a, b in zip(a_req, b_req))
    assert base.stats().prefix_cache_hits > 0                # the second copy and the second run hit the cache


def test_structured_output_is_drafted_within_its_grammar(base, tok):
    schema = {"type": "object", "properties": {"license": {"enum": ["BSD", "MIT", "GPL", "Apache"]},
                                               "conditions": {"type": "integer", "maximum": 99}},
              "required": ["license", "conditions"], "additionalProperties": False}
    prompt = chat_ids(tok, "Answer in JSON with the license name and the number of conditions.\n\n" + PASSAGE)
    params = SamplingParams(max_tokens=64, temperature=0,
                            structured=StructuredSpec("json", json.dumps(schema, sort_keys=True)))
    (off, _, _), (on, _, _), accepted = on_off(base, [prompt], params)
    # The run without drafting left its output in the drafter's tree: the run with it drafts the whole
    # answer, closing brace included, and the row after that draft allows only the end of sequence.
    assert on == off and accepted > 0
    doc = json.loads(tok.decode(on[0], skip_special_tokens=True))
    assert set(doc) == {"license", "conditions"}


def test_continuation_resumes_with_drafting(base, prompts):
    (full,), _, _ = run(base, prompts[:1], replace(GREEDY, speculative=False))
    half = full[:20]
    accepted = base.drafter.num_accepted_tokens
    (rest,), _, _ = run(base, [prompts[0] + half], replace(GREEDY, max_tokens=28, speculative=True))
    assert half + rest == full
    assert base.drafter.num_accepted_tokens > accepted


def test_seeded_sampling_is_reproducible_with_speculation(base, prompts):
    params = SamplingParams(max_tokens=32, temperature=0.8, top_p=0.95, seed=7, ignore_eos=True, speculative=True)
    corpus = copy.deepcopy(base.drafter.corpus)     # run a's outputs join the corpus: b must draft from the same one
    a, _, _ = run(base, prompts, params)
    base.drafter.corpus = corpus
    b, _, _ = run(base, prompts, params)
    assert a == b and all(len(x) == 32 for x in a)
