"""SwiftKV on every family the converter knows (Llama, Qwen2, Qwen3, Gemma 3 with its sliding
windows) against a dense reference built from transformers' own modules, on tiny random models.

Reference: the base model in transformers with, in every layer ``i >= l``, ``q_proj`` replaced by
``q_proj_swiftkv`` and ``k_proj`` / ``v_proj`` replaced by modules that ignore their input and
project ``norm_swiftkv(h_{l-1})`` (the residual stream after layer l-1, captured by a hook) with
the group leader's ``k/v_proj_swiftkv``; with AcrossKV the members also take the leader's
``k_norm``. transformers then runs every token through every layer with its own masks, RoPE per
layer type and QK-norm: at each position this is what SwiftKV computes for that position's logits
(later layers' K/V depend only on layers < l). The SwiftKV tensors are the papers' initialisation
plus noise, so a wrong tensor, norm or RoPE would show.

The engine (paged cache, chunked prefill, C++ kernels) must give the same greedy tokens and
log-probabilities within ``ATOL`` at every teacher-forced position. ``SWIFTKV_FAMILIES`` lists the
families checked (results/models/summary.json reads it).
"""

import pytest
import torch
from torch import nn

from modelkit.swiftkv import load_swiftkv_tensors, write_swiftkv_checkpoint
from refengine.config import EngineConfig
from refengine.engine import LLMEngine
from refengine.sampling_params import SamplingParams
from test_families_parity import _model

ATOL = 2e-4
SWIFTKV_FAMILIES = ["llama", "qwen2", "qwen3", "gemma3"]
# (kind of test_families_parity._model, l, g): Gemma 3's layers are sliding, sliding, global, sliding.
CASES = [("llama", 1, 2), ("qwen2-window", 1, 1), ("qwen3", 1, 2), ("gemma3", 1, 1), ("gemma3", 3, 1)]


class FromZ(nn.Module):
    """A projection that reads the captured ``norm_swiftkv(h_{l-1})`` instead of its input."""

    def __init__(self, store: dict, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.store, self.weight, self.bias = store, weight, bias

    def forward(self, x):
        return nn.functional.linear(self.store["z"], self.weight, self.bias)


def reference(hf, tensors: dict, l: int, g: int):
    """Patch ``hf`` (in place) into the dense SwiftKV reference described above."""
    layers = hf.model.layers
    store: dict = {}
    norm = type(hf.model.norm)(hf.config.hidden_size, eps=hf.config.rms_norm_eps)
    norm.weight.data.copy_(tensors["model.norm_swiftkv.weight"])

    def capture(module, args, out):
        store["z"] = norm(out if torch.is_tensor(out) else out[0])

    layers[l - 1].register_forward_hook(capture)
    get = lambda i, n: tensors.get(f"model.layers.{i}.self_attn.{n}")  # noqa: E731
    for i in range(l, len(layers)):
        lead = l + (i - l) // g * g
        att = layers[i].self_attn
        att.q_proj.weight.data.copy_(get(i, "q_proj_swiftkv.weight"))
        if att.q_proj.bias is not None:
            att.q_proj.bias.data.copy_(get(i, "q_proj_swiftkv.bias"))
        att.k_proj = FromZ(store, get(lead, "k_proj_swiftkv.weight"), get(lead, "k_proj_swiftkv.bias"))
        att.v_proj = FromZ(store, get(lead, "v_proj_swiftkv.weight"), get(lead, "v_proj_swiftkv.bias"))
        if hasattr(att, "k_norm"):
            att.k_norm = layers[lead].self_attn.k_norm
    return hf


@pytest.mark.parametrize("kind,l,g", CASES, ids=[f"{k}-l{l}-g{g}" for k, l, g in CASES])
def test_swiftkv_matches_transformers_reference(kind, l, g, tmp_path):
    torch.manual_seed(0)
    hf = _model(kind).eval()
    with torch.no_grad():
        for n, p in hf.named_parameters():
            if n.endswith("bias") or "norm" in n:
                p.normal_(0, 0.3).add_(0 if "gemma" in kind or n.endswith("bias") else 1)
    hf.save_pretrained(tmp_path / "base")
    noisy = {k: v + 0.02 * torch.randn_like(v) for k, v in
             load_swiftkv_tensors(write_swiftkv_checkpoint(tmp_path / "base", tmp_path / "init", l, g)).items()}
    out = write_swiftkv_checkpoint(tmp_path / "base", tmp_path / "swiftkv", l, g, noisy)
    ref = reference(hf, noisy, l, g)
    torch.manual_seed(1)
    prompts = [torch.randint(3, 512, (n,)).tolist() for n in (7, 64)]
    eng = LLMEngine(EngineConfig(model=str(out), max_model_len=512, num_kv_blocks=64, block_size=8,
                                 max_num_batched_tokens=32))
    assert eng.runner.model.use_swiftkv and eng.runner.model.num_kv_layers == l
    got = eng.generate(prompts, SamplingParams(max_tokens=10, temperature=0, ignore_eos=True))
    with torch.no_grad():
        for p, toks in zip(prompts, got):
            want = ref.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                max_new_tokens=10, do_sample=False, eos_token_id=None, pad_token_id=0)
            assert toks == want[0, len(p):].tolist()
        p = prompts[1]
        ref_logp = torch.log_softmax(ref(torch.tensor([p])).logits[0, 9:-1].float(), -1)
    rows = eng.score([(p[:10], p[10:])], want_dist=True)[0]
    err = (torch.stack([r[2] for r in rows]) - ref_logp).abs().max().item()
    assert err < ATOL, f"{kind} l={l} g={g}: max |log p - log p_ref| = {err:.2e}"


def test_acrosskv_groups_may_not_mix_window_and_global_layers(tmp_path):
    hf = _model("gemma3")                        # layers: sliding, sliding, global, sliding
    hf.save_pretrained(tmp_path / "base")
    with pytest.raises(ValueError, match="mixes sliding-window and global layers"):
        write_swiftkv_checkpoint(tmp_path / "base", tmp_path / "out", 1, 2)
