"""The drafter without a model: suffix matching, frequency continuations, the corpus bound, the
load-aware budget and the draft limits (max_tokens, context), and the config's refusals."""

import pytest

from refengine.request import Request
from refengine.sampling_params import SamplingParams
from refengine.spec.config import SpecConfig, SpecConfigError
from refengine.spec.corpus import OutputCorpus
from refengine.spec.drafter import Drafter
from refengine.spec.index import TokenIndex


def decoding(tokens, prompt_len, max_tokens=64, speculative=None, rid="r"):
    """A request in decode state: prompt + output so far, every token but the last computed."""
    req = Request(rid, tokens[:prompt_len], SamplingParams(max_tokens=max_tokens, speculative=speculative), (0,), 4096)
    req.token_ids.extend(tokens[prompt_len:])
    req.num_computed_tokens = len(tokens) - 1
    req.prefilled = True
    return req


def test_longest_match_and_its_continuation():
    text = [5, 6, 7, 8, 9, 10, 11, 1, 2, 7, 8, 20, 21, 3, 6, 7, 8]
    idx = TokenIndex(list(text))
    idx.extend()
    m, starts = idx.match(text, max_depth=8)
    assert m == 3 and starts == [4]                  # "6 7 8" occurs once before the end, then 9 10 11
    draft, score = idx.continuation(starts, 4, min_prob=0.1)
    assert draft == [9, 10, 11, 1] and score == pytest.approx(4.0)


def test_frequency_tree_stops_below_min_prob():
    # "0 1 2" followed by 3 three times and by 4 once: 3 has probability 3/4; then 5, 6, 7: 1/3 each (0.25).
    text = [0, 1, 2, 3, 5, 0, 1, 2, 3, 6, 0, 1, 2, 3, 7, 0, 1, 2, 4, 0, 1, 2]
    idx = TokenIndex(list(text))
    idx.extend()
    m, starts = idx.match(text, max_depth=8)
    assert m == 3 and len(starts) == 4              # "0 1 2" four times
    assert idx.continuation(starts, 4, min_prob=0.5)[0] == [3]
    assert idx.continuation(starts, 4, min_prob=0.3)[0] == [3]
    assert idx.continuation(starts, 4, min_prob=0.2)[0] == [3, 7, 0, 1]    # a tie goes to the most recent


def test_one_token_match_when_no_bigram_recurs():
    # The last bigram (9, 4) never occurred before, but 4 did, twice followed by 5: a one-token match
    # (a suffix tree's depth-1 node), drafted by frequency as deeper matches are; min_len=2 refuses it.
    # The drafter matches 2 tokens at least by default (min_match; results/spec/README.md, round 2).
    text = [1, 4, 5, 6, 2, 4, 5, 7, 3, 4, 8, 9, 4]
    idx = TokenIndex(list(text))
    idx.extend()
    assert idx.match(text, max_depth=8) == (0, [])
    m, starts = idx.match(text, max_depth=8, min_len=1)
    assert m == 1 and starts == [10, 6, 2]                   # after each earlier 4, most recent first
    assert idx.continuation(starts, 1, min_prob=0.1) == ([5], pytest.approx(2 / 3))
    assert idx.match([99], max_depth=8, min_len=1) == (0, [])
    req = decoding(text, 10)
    d = Drafter(SpecConfig.parse({"method": "suffix"}))
    d.propose([req], enabled_by_default=True)
    assert req.spec_token_ids == []                           # the default: suffixes of at least 2 tokens
    d.min_match = 1
    d.propose([req], enabled_by_default=True)
    assert req.spec_token_ids == [5]                          # match length 1, spec factor 1: one token


def test_a_lone_request_drafts_past_the_knee():
    cfg = SpecConfig.parse({"method": "suffix"})
    assert cfg.max_draft(1) == cfg.num_speculative_tokens == 24 and cfg.max_draft(2) == 3
    assert SpecConfig.parse({"method": "suffix", "num_speculative_tokens": 10}).max_draft(1) == 10
    prompt = list(range(100, 160))
    req = decoding(prompt + list(range(100, 130)), 60)
    Drafter(cfg).propose([req], enabled_by_default=True)
    assert req.spec_token_ids == list(range(130, 154))        # a 24-token match: the whole 24


def test_drafts_copy_the_prompt_and_adapt_to_the_match():
    prompt = list(range(100, 160))
    req = decoding(prompt + [100, 101, 102, 103], 60)
    d = Drafter(SpecConfig.parse({"method": "suffix", "num_speculative_tokens_per_batch_size": [[1, 8, 16]]}))
    d.propose([req], enabled_by_default=True)
    assert req.spec_token_ids == list(range(104, 108))     # match of 4 tokens, spec factor 1: 4 tokens
    req.token_ids.extend(range(104, 120))
    req.num_computed_tokens = len(req.token_ids) - 1
    d.propose([req], enabled_by_default=True)
    assert req.spec_token_ids == list(range(120, 136))     # longer match: the full 16


def test_no_draft_past_max_tokens_context_or_when_not_decoding():
    prompt = list(range(100, 160))
    d = Drafter(SpecConfig.parse({"method": "suffix"}))
    req = decoding(prompt + list(range(100, 120)), 60, max_tokens=25)
    d.propose([req], enabled_by_default=True)
    assert len(req.spec_token_ids) == 25 - 20 - 1           # the bonus token fills max_tokens
    off = decoding(prompt + list(range(100, 120)), 60, speculative=False, rid="off")
    d.propose([off], enabled_by_default=True)
    assert off.spec_token_ids == []
    behind = decoding(prompt + list(range(100, 120)), 60, rid="behind")
    behind.num_computed_tokens -= 5                           # still prefilling (a chunk behind)
    d.propose([behind], enabled_by_default=True)
    assert behind.spec_token_ids == []
    req.max_model_len = len(req.token_ids) + 2
    d.propose([req], enabled_by_default=True)
    assert len(req.spec_token_ids) == 2


def test_back_off_by_batch_size():
    cfg = SpecConfig.parse({"method": "suffix", "num_speculative_tokens_per_batch_size": [[1, 1, 8], [2, 3, 2]]})
    assert [cfg.max_draft(b) for b in (1, 2, 3, 4, 100)] == [8, 2, 2, 0, 0]
    prompt = list(range(100, 160))
    reqs = [decoding(prompt + list(range(100, 120)), 60, rid=str(i)) for i in range(4)]
    d = Drafter(cfg)
    d.propose(reqs, enabled_by_default=True)
    assert all(r.spec_token_ids == [] for r in reqs) and d.steps_backed_off == 1
    d.propose(reqs[:2], enabled_by_default=True)
    assert all(len(r.spec_token_ids) == 2 for r in reqs[:2])


def test_corpus_drafts_from_earlier_outputs_and_stays_bounded():
    d = Drafter(SpecConfig.parse({"method": "suffix", "suffix_decoding_max_cached_requests": 2}))
    answer = list(range(500, 540))
    done = decoding(list(range(10)) + answer, 10, rid="done")
    done.status = done.status.FINISHED_STOPPED
    d.finished(done)
    req = decoding(list(range(20, 30)) + answer[:6], 10, rid="new")   # its own tokens never had 506
    d.propose([req], enabled_by_default=True)
    assert req.spec_token_ids[:3] == [506, 507, 508]
    c = OutputCorpus(max_requests=2, max_tokens=100)
    for i in range(5):
        c.add(list(range(1000 * i, 1000 * i + 30)))
    assert c.num_outputs == 2 and c.num_tokens <= 100
    assert c.lookup([3000, 3001, 3002], 8, lambda m: 4, 0.1)[1] == [3003, 3004, 3005, 3006]
    assert c.lookup([1000, 1001, 1002], 8, lambda m: 4, 0.1)[1] == []        # evicted
    big = OutputCorpus(max_requests=100, max_tokens=50)
    for i in range(20):
        big.add(list(range(1000 * i, 1000 * i + 30)))
    assert big.num_tokens <= 50 and len(big.index.tokens) <= 200             # compacted as it goes


def test_ngram_takes_the_most_recent_match():
    cfg = SpecConfig.parse({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4})
    req = decoding([1, 2, 3, 4, 9, 9, 1, 2, 3, 5, 9, 1, 2, 3], 10)
    Drafter(cfg).propose([req], enabled_by_default=True)
    assert req.spec_token_ids == [5, 9, 1]
    # prompt_lookup_min=1: the last token alone matches (its last bigram (8, 3) is new)
    one = SpecConfig.parse({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1})
    req = decoding([3, 4, 5, 9, 8, 3], 5)
    Drafter(one).propose([req], enabled_by_default=True)
    assert req.spec_token_ids == [4, 5]
    req = decoding([3, 4, 5, 9, 8, 3], 5)
    Drafter(cfg).propose([req], enabled_by_default=True)
    assert req.spec_token_ids == []                           # prompt_lookup_min=2 (default): no match


@pytest.mark.parametrize("value,words", [
    ({"method": "eagle"}, "method must be one of"),
    ({"method": "suffix", "model": "x"}, "key 'model' is not supported"),
    ({"method": "suffix", "num_speculative_tokens": 0}, "num_speculative_tokens=0 must be >= 1"),
    ({"method": "suffix", "suffix_decoding_min_token_prob": 2}, "in [0, 1]"),
    ({"method": "ngram", "prompt_lookup_min": 4, "prompt_lookup_max": 3}, "prompt_lookup_max=3"),
    ({"method": "suffix", "num_speculative_tokens_per_batch_size": [[2, 1, 4]]}, "range_start <= range_end"),
    ('{"method": ', "not JSON"),
])
def test_config_refusals_name_the_key(value, words):
    with pytest.raises(SpecConfigError, match=None) as e:
        SpecConfig.parse(value)
    assert words in str(e.value)


def test_scheduler_verifies_a_draft_and_keeps_only_accepted_entries():
    from refengine.block_manager import BlockManager
    from refengine.scheduler import Scheduler

    bm = BlockManager(16, 4, enable_prefix_caching=True)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=5)
    req = Request("a", list(range(10, 16)), SamplingParams(max_tokens=10), (0,), 64)
    sched.add(req)
    out = sched.schedule()                                   # the prompt: 5 of 6 tokens (budget), then 1
    sched.update(out, {})
    out = sched.schedule()
    sched.update(out, {"a": [20]})
    assert req.num_computed_tokens == 6 and req.token_ids[-1] == 20
    req.spec_token_ids = [21, 22, 23, 24, 25]
    out = sched.schedule()
    (c,) = out.chunks
    assert (c.start, c.num_tokens, c.draft) == (6, 5, [21, 22, 23, 24])   # the budget cut the draft to 4
    sched.update(out, {"a": [21, 22, 30]})                               # two accepted, then a correction
    assert req.token_ids[6:] == [20, 21, 22, 30] and req.num_computed_tokens == 9 and req.spec_token_ids == []
    assert bm._registered["a"] == 2                          # blocks of computed tokens only (8 of 9)
    req.spec_token_ids = [31, 0, 33]
    out = sched.schedule()
    sched.update(out, {"a": [31, 0, 33]})                    # EOS (0) accepted: the rest is dropped
    assert req.status.finished and req.token_ids[-2:] == [31, 0]
    assert bm.num_free == bm.num_blocks                    # every block returned (the cached ones stay reusable)
