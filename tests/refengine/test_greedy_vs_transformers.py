"""The reference engine's greedy output equals transformers' greedy generation, token for token,
on the real SmolLM2 model: batched, with chunked prefill, and with tiny KV blocks."""

import pytest
import torch

from refengine.config import EngineConfig
from refengine.engine import LLMEngine
from refengine.sampling_params import SamplingParams

pytestmark = [pytest.mark.slow, pytest.mark.model]

N_NEW = 32
TEXTS = ["The capital of France is", "def fibonacci(n):\n", "Once upon a time, in a small village,"]


@pytest.fixture(scope="module")
def prompts_and_reference(smollm2_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    hf = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    chat = tok.apply_chat_template([{"role": "user", "content": "Write a haiku about the sea."}],
                                   add_generation_prompt=True, tokenize=True)
    chat = list(chat["input_ids"] if hasattr(chat, "keys") else chat)
    prompts = [tok(t)["input_ids"] for t in TEXTS] + [chat]
    ref = []
    with torch.no_grad():
        for p in prompts:
            # Explicit attention mask: the chat prompt contains the pad id (2 = <|im_end|>),
            # which generate() would otherwise mask out.
            out = hf.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                              max_new_tokens=N_NEW, do_sample=False, eos_token_id=None, pad_token_id=0)
            ref.append(out[0, len(p):].tolist())
    return prompts, ref


@pytest.mark.parametrize("engine_kw", [
    {},                                                          # whole prompts in one step, batched
    {"max_num_batched_tokens": 7, "block_size": 4},              # chunked prefill across steps
    {"max_num_seqs": 1},                                         # one request at a time
], ids=["batched", "chunked", "serial"])
def test_greedy_matches_transformers(smollm2_dir, prompts_and_reference, engine_kw):
    prompts, ref = prompts_and_reference
    cfg = EngineConfig(model=str(smollm2_dir), max_model_len=1024, num_kv_blocks=512, **engine_kw)
    eng = LLMEngine(cfg)
    got = eng.generate(prompts, SamplingParams(max_tokens=N_NEW, temperature=0, ignore_eos=True))
    for p, r, g in zip(prompts, ref, got):
        assert g == r, f"prompt of {len(p)} tokens diverged"
