"""Llama-family variants against transformers on tiny random models: Llama-3 RoPE scaling,
untied lm_head, Qwen2 q/k/v biases, Mistral, linear and YaRN RoPE scaling. Greedy tokens and
next-token logits must agree."""

import pytest
import torch

from refengine.config import EngineConfig
from refengine.engine import LLMEngine
from refengine.sampling_params import SamplingParams

COMMON = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
              num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5,
              bos_token_id=1, eos_token_id=2, pad_token_id=0)


def _model(kind: str):
    import transformers as tf

    if kind == "llama3":
        cfg = tf.LlamaConfig(**COMMON, tie_word_embeddings=False, rope_theta=500000.0,
                             rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                           "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
        return tf.LlamaForCausalLM(cfg)
    if kind == "llama-linear":
        return tf.LlamaForCausalLM(tf.LlamaConfig(**COMMON, rope_scaling={"rope_type": "linear", "factor": 2.0}))
    if kind == "llama-yarn":
        return tf.LlamaForCausalLM(tf.LlamaConfig(**COMMON, rope_scaling={
            "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}))
    if kind == "qwen2":
        return tf.Qwen2ForCausalLM(tf.Qwen2Config(**COMMON, tie_word_embeddings=True))
    if kind == "mistral":
        return tf.MistralForCausalLM(tf.MistralConfig(**COMMON, sliding_window=None))
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["llama3", "llama-linear", "llama-yarn", "qwen2", "mistral"])
def test_matches_transformers(kind, tmp_path):
    torch.manual_seed(0)
    hf = _model(kind).eval()
    with torch.no_grad():
        for n, p in hf.named_parameters():
            if n.endswith("bias"):
                p.normal_(0, 0.5)           # make Qwen2's biases matter
    hf.save_pretrained(tmp_path)
    prompts = [torch.randint(3, 512, (n,)).tolist() for n in (7, 150)]
    eng = LLMEngine(EngineConfig(model=str(tmp_path), max_model_len=512, num_kv_blocks=64, block_size=8,
                                 max_num_batched_tokens=64))
    got = eng.generate(prompts, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    scores = eng.score([(p[:-1], p[-1:]) for p in prompts], want_dist=True)
    for p, g, sc in zip(prompts, got, scores):
        with torch.no_grad():
            out = hf.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                              max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
            logp = torch.log_softmax(hf(torch.tensor([p])).logits[0, -2].float(), -1)
        assert g == out[0, len(p):].tolist()
        assert torch.allclose(sc[0][2], logp, atol=1e-4)
