"""The real Gemma 3 270M (``modelkit prepare --model gemma-3-270m --accept-license``; opt-in:
the Gemma Terms of Use must be accepted by whoever prepares it, so CI never downloads it and
these tests skip when it is not prepared):

- our engine's greedy tokens equal transformers' on the same directory, for a short prompt and
  for a 700-token one (past the 512-token window of its 15 sliding layers), and its next-token
  log-probabilities through the cache match within 2e-3 (float32, 262K-entry vocabulary);
- the windowed layers hold fewer blocks than the global ones after the long prompt;
(``swiftserve up`` serving it: tests/swiftserve/test_stack_gemma3.py.)
"""

import pytest
import torch

from refengine.config import EngineConfig
from refengine.engine import LLMEngine
from refengine.sampling_params import SamplingParams

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def gemma_dir():
    from modelkit import prepare_gemma
    from swiftcommon import envs

    if not prepare_gemma.is_prepared(envs.cache_dir()):
        pytest.skip("Gemma 3 270M is not prepared (opt-in: modelkit prepare --model gemma-3-270m --accept-license)")
    return prepare_gemma.model_dir(envs.cache_dir())


def test_engine_matches_transformers_on_gemma3_270m(gemma_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gemma_dir)
    hf = AutoModelForCausalLM.from_pretrained(gemma_dir, dtype=torch.float32).eval()
    text = " ".join(f"Item {i} of the list is the number {i * 7 % 97}." for i in range(60))
    prompts = [tok("The capital of France is")["input_ids"], tok(text)["input_ids"][:700]]
    eng = LLMEngine(EngineConfig(model=str(gemma_dir), max_model_len=1024, kv_cache_memory_gb=0.25,
                                 max_num_batched_tokens=256))
    got = eng.generate(prompts, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))
    with torch.no_grad():
        for p, g in zip(prompts, got):
            ref = hf.generate(torch.tensor([p]), max_new_tokens=16, do_sample=False, eos_token_id=None)
            assert g == ref[0, len(p):].tolist()
        p = prompts[1]
        ref_logp = torch.log_softmax(hf(torch.tensor([p])).logits[0, 599:-1].float(), -1)
    rows = eng.score([(p[:600], p[600:])], want_dist=True)[0]
    assert (torch.stack([r[2] for r in rows]) - ref_logp).abs().max() < 2e-3
    bm = eng.block_manager
    eng.add_request("long", prompts[1], SamplingParams(max_tokens=2, temperature=0))
    while not eng.step():                          # prefill in chunks until the first token
        pass
    glob, win = bm.groups
    assert win.num_used < glob.num_used            # the 512-token window freed its oldest blocks


