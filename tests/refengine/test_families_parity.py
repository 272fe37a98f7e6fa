"""Every served family against transformers on tiny random-weights models built here (no download):
Llama, Mistral and Qwen2 with sliding windows smaller than the prompt, Qwen3 (QK-norm, with and
without windows) and Gemma 3 (interleaved sliding/global layers with their own RoPE bases, QK-norm,
GeGLU, (1 + w) norms, scaled embeddings, its softmax scale and a final logit cap).

Per family, through the engine's paged cache with chunked prefill (64-token steps, 8-token
blocks, 24-token windows: not a multiple of the block), both attention paths (the C++ kernels
and gather + SDPA):
- greedy tokens equal transformers' ``generate`` (12 new tokens after 7- and 150-token prompts);
- next-token log-probabilities at every position after the 20th, teacher-forced through the
  cache (so decode crosses the window), match transformers' within ``ATOL`` (float32).
The list of families checked here is ``PARITY_FAMILIES`` (results/models/summary.json reads it).
"""

import shutil

import pytest
import torch

from refengine.config import EngineConfig
from refengine.engine import LLMEngine
from refengine.sampling_params import SamplingParams

ATOL = 2e-4          # max abs difference of log-probabilities (float32)
WINDOW = 24
COMMON = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
              num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5,
              bos_token_id=1, eos_token_id=2, pad_token_id=0)
PARITY_FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "gemma3"]


def _model(kind: str):
    import transformers as tf

    if kind == "llama":
        return tf.LlamaForCausalLM(tf.LlamaConfig(**COMMON, tie_word_embeddings=False))
    if kind == "mistral-window":
        return tf.MistralForCausalLM(tf.MistralConfig(**COMMON, sliding_window=WINDOW))
    if kind == "qwen2-window":
        return tf.Qwen2ForCausalLM(tf.Qwen2Config(**COMMON, use_sliding_window=True, sliding_window=WINDOW,
                                                  max_window_layers=1, tie_word_embeddings=True))
    if kind == "qwen3":
        return tf.Qwen3ForCausalLM(tf.Qwen3Config(**COMMON, head_dim=32, tie_word_embeddings=False))
    if kind == "qwen3-window":
        return tf.Qwen3ForCausalLM(tf.Qwen3Config(**COMMON, head_dim=32, use_sliding_window=True,
                                                  sliding_window=WINDOW, max_window_layers=1))
    if kind == "gemma3":
        cfg = tf.Gemma3TextConfig(
            **dict(COMMON, num_hidden_layers=4, num_attention_heads=4, bos_token_id=2, eos_token_id=1),
            head_dim=64, query_pre_attn_scalar=48, sliding_window=WINDOW, final_logit_softcapping=30.0,
            layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
            rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                             "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}})
        return tf.Gemma3ForCausalLM(cfg)
    raise ValueError(kind)


def _family(kind: str) -> str:
    return kind.split("-")[0]


KINDS = ["llama", "mistral-window", "qwen2-window", "qwen3", "qwen3-window", "gemma3"]
assert sorted({_family(k) for k in KINDS}) == sorted(PARITY_FAMILIES)


@pytest.fixture(scope="module", params=KINDS)
def hf_model(request, tmp_path_factory):
    torch.manual_seed(0)
    hf = _model(request.param).eval()
    with torch.no_grad():
        for n, p in hf.named_parameters():
            if n.endswith("bias"):
                p.normal_(0, 0.5)                   # Qwen2's q/k/v biases matter
            elif "norm" in n:
                p.normal_(0, 0.3).add_(0 if "gemma" in request.param else 1)   # QK-norm and (1 + w) matter
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    torch.manual_seed(1)
    prompts = [torch.randint(3, 512, (n,)).tolist() for n in (7, 150)]
    with torch.no_grad():
        ref_tokens = [hf.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                  max_new_tokens=12, do_sample=False, eos_token_id=None,
                                  pad_token_id=0)[0, len(p):].tolist() for p in prompts]
        ref_logp = torch.log_softmax(hf(torch.tensor([prompts[1]])).logits[0].float(), -1)
    return request.param, path, prompts, ref_tokens, ref_logp


@pytest.mark.parametrize("kernels", ["cpp", "torch"])
def test_family_matches_transformers(hf_model, kernels):
    kind, path, prompts, ref_tokens, ref_logp = hf_model
    if kernels == "cpp" and not shutil.which("c++"):
        pytest.skip("no C++ compiler for the kernels")
    eng = LLMEngine(EngineConfig(model=str(path), max_model_len=512, num_kv_blocks=64, block_size=8,
                                 max_num_batched_tokens=64, decode_kernel=kernels, prefill_kernel=kernels,
                                 fused_ops=kernels))
    windowed = "window" in kind or kind == "gemma3"
    assert bool(eng.spec.layer_windows) == windowed
    got = eng.generate(prompts, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    assert got == ref_tokens
    p = prompts[1]
    rows = eng.score([(p[:20], p[20:])], want_dist=True)[0]
    ours = torch.stack([r[2] for r in rows])                          # positions 19 .. len-2
    err = (ours - ref_logp[19:-1]).abs().max().item()
    assert err < ATOL, f"{kind}: max |log p - log p_hf| = {err:.2e}"
    if windowed:                                   # the window slid: blocks before it went back
        assert eng.stats().extra["kv_window_blocks_freed"] > 0
    assert eng.block_manager.num_used == 0         # and nothing leaked
