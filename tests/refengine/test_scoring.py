"""LLMEngine.score: continuation log-probs through the cache equal a full transformers forward."""

import pytest
import torch

from refengine.config import EngineConfig
from refengine.engine import LLMEngine

pytestmark = [pytest.mark.slow, pytest.mark.model]


def test_score_matches_transformers_teacher_forcing(smollm2_dir):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    torch.manual_seed(0)
    seqs = [torch.randint(100, 30000, (n,)).tolist() for n in (40, 57)]
    items = [(s[:30], s[30:]) for s in seqs]
    eng = LLMEngine(EngineConfig(model=str(smollm2_dir), max_model_len=256, num_kv_blocks=64, block_size=8))
    scores = eng.score(items, want_dist=True)
    for (prefix, cont), sc in zip(items, scores):
        with torch.no_grad():
            logp = torch.log_softmax(hf(torch.tensor([prefix + cont])).logits[0].float(), -1)
        assert len(sc) == len(cont)
        for j, (lp, argmax, row) in enumerate(sc):
            ref = logp[len(prefix) - 1 + j]
            assert abs(lp - float(ref[cont[j]])) < 1e-3
            assert argmax == int(ref.argmax())
            assert torch.allclose(row, ref, atol=1e-3)
    assert eng.block_manager.num_used == 0
