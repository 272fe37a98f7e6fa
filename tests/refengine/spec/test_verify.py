"""Acceptance without a model: greedy keeps exactly the argmax path; sampling with the rejection rule
keeps each position's distribution (the first emitted token is distributed as p_0 whatever the draft);
penalties and logprobs see each row's own context."""

import torch

from refengine.sampler import SampleRow
from refengine.sampling_params import SamplingParams
from refengine.spec.verify import accept

V = 6


def rows_for(params, n, gen=None, ctx=(1, 2)):
    return [SampleRow(params, list(ctx), 1, gen, ()) for _ in range(n)]


def test_greedy_accepts_the_argmax_prefix_and_adds_one():
    logits = torch.full((4, V), -5.0)
    for r, t in enumerate([3, 4, 0, 2]):
        logits[r, t] = 5.0
    p = SamplingParams(temperature=0, max_tokens=8)
    assert accept(logits, rows_for(p, 4), [(0, [3, 4, 1])], None)[0][0] == [3, 4, 0]      # rejected at 2: argmax 0
    assert accept(logits, rows_for(p, 4), [(0, [3, 4, 0])], None)[0][0] == [3, 4, 0, 2]   # all kept + bonus
    assert accept(logits, rows_for(p, 4), [(0, [1, 4, 0])], None)[0][0] == [3]


def test_rejection_sampling_keeps_the_distribution():
    g = torch.Generator().manual_seed(0)
    probs = torch.tensor([0.05, 0.4, 0.3, 0.15, 0.1, 0.0])
    p = SamplingParams(temperature=1.0, max_tokens=8)
    n, per_call = 20000, 1000                   # 1000 requests per call, each with its 3 rows
    logits = probs.clamp_min(1e-30).log().expand(3 * per_call, V).clone()
    rows = rows_for(p, 3 * per_call, g)
    first = torch.zeros(V)
    second = torch.zeros(V)
    for _ in range(n // per_call):
        for toks, _ in accept(logits, rows, [(3 * i, [3, 1]) for i in range(per_call)], None):  # an unlikely draft
            first[toks[0]] += 1
            if len(toks) > 1:
                second[toks[1]] += 1
    assert torch.allclose(first / n, probs, atol=0.012)
    # the second token is emitted only after the draft's 3 was accepted (p = 0.15), again distributed as p
    assert abs(second.sum() / n - 0.15) < 0.012
    assert torch.allclose(second / second.sum(), probs, atol=0.03)


def test_rows_see_their_own_context_and_logprobs_follow_the_emitted_tokens():
    logits = torch.zeros(3, V)
    logits[:, 2] = 1.0                          # 2 is the best token everywhere...
    p = SamplingParams(temperature=0, max_tokens=8, presence_penalty=2.0, logprobs=1)
    rows = [SampleRow(p, [0, 5], 1, None, ()), SampleRow(p, [0, 5, 2], 1, None, ()), SampleRow(p, [0, 5, 2, 3], 1, None, ())]
    toks, lps = accept(logits, rows, [(0, [2, 3])], None)[0]
    # ...until the draft put it in the output: row 1 penalises 2 and picks 0 (first of the ties), not the draft's 3
    assert toks == [2, 0]
    assert [lp.token_id for lp in lps] == toks
    assert lps[0].top[0][0] == 2 and abs(lps[0].logprob - float(torch.log_softmax(logits[0], -1)[2])) < 1e-6
