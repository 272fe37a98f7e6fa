"""The sampler under a grammar's mask when the request's own options leave no token: the token is always one the mask allows (found by benchmarks/serve/hostile.py: a sampled token
outside the grammar failed the request in the engine)."""

import pytest
import torch

from refengine.sampler import SampleRow, sample
from refengine.sampling_params import SamplingParams
from refengine.structured.masks import TokenMasks

V = 64
ALLOWED = (3, 7)


def _masks() -> TokenMasks:
    bits = torch.zeros(1, (V + 31) // 32, dtype=torch.int32)
    for t in ALLOWED:
        bits[0, t // 32] |= 1 << t
    return TokenMasks([1], bits)        # the second row of the batch is constrained


@pytest.mark.parametrize("kw", [
    {"temperature": 0.0, "frequency_penalty": 3e38},          # every allowed token penalised to -inf
    {"temperature": 1.0, "frequency_penalty": 3e38},
    {"temperature": 1.0, "repetition_penalty": 1e38},         # negative logits of seen tokens -> -inf
], ids=["greedy-freq", "random-freq", "random-rep"])
def test_a_constrained_row_always_gets_an_allowed_token(kw):
    logits = torch.randn(2, V, generator=torch.Generator().manual_seed(0)) * 5
    logits[:, ALLOWED] = -4.0                 # allowed tokens below zero: a huge repetition penalty sends them to -inf
    logits[:, 0] = 30.0                       # the unconstrained favourite, outside the grammar
    context = list(range(V)) + list(ALLOWED) * 2
    rows = [SampleRow(SamplingParams(temperature=0.0), context, V, None, ()),
            SampleRow(SamplingParams(**kw), context, V, None, ())]
    for seed in range(20):
        tokens, _ = sample(logits.clone(), rows, torch.Generator().manual_seed(seed), _masks())
        assert tokens[0] == 0 and tokens[1] in ALLOWED, tokens
