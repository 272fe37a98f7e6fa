"""SwiftKV in the reference engine against an independent dense PyTorch implementation.

The reference below is written from the paper, not from the engine: full-sequence
recomputation every step, explicit softmax attention, no cache, no paging. The
engine must produce the same greedy tokens for SwiftKV (l=15 of 30) with and
without AcrossKV (g=2), including under chunked prefill and in mixed batches.
"""

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from modelkit.swiftkv import write_swiftkv_checkpoint
from refengine.config import EngineConfig
from refengine.engine import LLMEngine
from refengine.sampling_params import SamplingParams

pytestmark = [pytest.mark.slow, pytest.mark.model]

N_NEW = 24
PROMPTS = [
    [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28],
    [504, 3575, 282, 4649, 314],
    list(range(1000, 1041)),
]


class DenseSwiftKV:
    """Plain dense forward of a (SwiftKV) Llama checkpoint; l = L means the baseline."""

    def __init__(self, model_dir, swiftkv: bool = True):
        cfg = json.loads((model_dir / "config.json").read_text())
        self.W = {}
        for f in sorted(model_dir.glob("*.safetensors")):
            self.W.update(load_file(str(f)))
        self.L = cfg["num_hidden_layers"]
        self.l = cfg.get("num_key_value_layers", self.L) if (swiftkv and cfg.get("swiftkv")) else self.L
        self.g = cfg.get("key_value_group_size", 1)
        self.Hq, self.Hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.D = cfg["hidden_size"] // self.Hq
        self.eps = cfg["rms_norm_eps"]
        rp = cfg.get("rope_parameters") or {}
        self.theta = rp.get("rope_theta", cfg.get("rope_theta", 10000.0))

    def norm(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    def rope(self, t, T):  # t [H, T, D]
        D = self.D
        inv = 1.0 / (self.theta ** (torch.arange(0, D, 2).float() / D))
        ang = torch.arange(T).float()[:, None] * inv[None, :]
        cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
        return t * cos + torch.cat([-t[..., D // 2:], t[..., :D // 2]], -1) * sin

    def attn(self, q, k, v):  # q [Hq,T,D], k/v [Hkv,T,D]
        rep = self.Hq // self.Hkv
        k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
        s = q @ k.transpose(1, 2) / math.sqrt(self.D)
        T = q.shape[1]
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        return s.softmax(-1) @ v

    def heads(self, x, n):
        return x.view(x.shape[0], n, self.D).transpose(0, 1)

    def layer_tail(self, i, x, a):
        W, p = self.W, f"model.layers.{i}."
        x = x + a.transpose(0, 1).reshape(x.shape[0], -1) @ W[p + "self_attn.o_proj.weight"].T
        h = self.norm(x, W[p + "post_attention_layernorm.weight"])
        g, u = h @ W[p + "mlp.gate_proj.weight"].T, h @ W[p + "mlp.up_proj.weight"].T
        return x + (torch.nn.functional.silu(g) * u) @ W[p + "mlp.down_proj.weight"].T

    @torch.no_grad()
    def next_logits(self, ids):
        W, T = self.W, len(ids)
        x = W["model.embed_tokens.weight"][torch.tensor(ids)]
        for i in range(self.l):
            p = f"model.layers.{i}."
            h = self.norm(x, W[p + "input_layernorm.weight"])
            q = self.rope(self.heads(h @ W[p + "self_attn.q_proj.weight"].T, self.Hq), T)
            k = self.rope(self.heads(h @ W[p + "self_attn.k_proj.weight"].T, self.Hkv), T)
            v = self.heads(h @ W[p + "self_attn.v_proj.weight"].T, self.Hkv)
            x = self.layer_tail(i, x, self.attn(q, k, v))
        if self.l < self.L:
            z = self.norm(x, W["model.norm_swiftkv.weight"])
            kv = {}
            for i in range(self.l, self.L):
                lead = self.l + (i - self.l) // self.g * self.g
                p = f"model.layers.{lead}.self_attn."
                if lead not in kv:
                    kv[lead] = (self.rope(self.heads(z @ W[p + "k_proj_swiftkv.weight"].T, self.Hkv), T),
                                self.heads(z @ W[p + "v_proj_swiftkv.weight"].T, self.Hkv))
                p = f"model.layers.{i}."
                h = self.norm(x, W[p + "input_layernorm.weight"])
                q = self.rope(self.heads(h @ W[p + "self_attn.q_proj_swiftkv.weight"].T, self.Hq), T)
                x = self.layer_tail(i, x, self.attn(q, *kv[lead]))
        return self.norm(x[-1], W["model.norm.weight"]) @ W["model.embed_tokens.weight"].T

    def greedy(self, ids, n):
        ids, out = list(ids), []
        for _ in range(n):
            t = int(self.next_logits(ids).argmax())
            out.append(t)
            ids.append(t)
        return out


@pytest.fixture(scope="module")
def ckpts(smollm2_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("swiftkv")
    return {g: write_swiftkv_checkpoint(smollm2_dir, root / f"l15g{g}", 15, g) for g in (1, 2)}


def engine(model_dir, **kw):
    kw.setdefault("num_kv_blocks", 256)
    return LLMEngine(EngineConfig(model=str(model_dir), max_model_len=512, **kw))


GREEDY = SamplingParams(max_tokens=N_NEW, temperature=0, ignore_eos=True)


@pytest.mark.parametrize("g", [1, 2])
def test_engine_matches_dense_reference(ckpts, g):
    ref = DenseSwiftKV(ckpts[g])
    expected = [ref.greedy(p, N_NEW) for p in PROMPTS]
    plain = {"fused_ops": "torch", "decode_kernel": "torch", "prefill_kernel": "torch"}   # no C++ kernels
    for kw in ({}, {"max_num_batched_tokens": 9, "block_size": 4}, plain):
        got = engine(ckpts[g], **kw).generate(PROMPTS, GREEDY)
        assert got == expected, f"g={g} {kw}"


def test_acrosskv_shrinks_the_block_pool(ckpts, smollm2_dir):
    budget = dict(kv_cache_memory_gb=0.05, num_kv_blocks=None)
    base, g1, g2 = engine(smollm2_dir, **budget), engine(ckpts[1], **budget), engine(ckpts[2], **budget)
    # 30 layers, 3 KV heads x 64 dims, K and V, fp32: 46080 bytes per token.
    assert base.stats().kv_bytes_per_token == 30 * 2 * 3 * 64 * 4
    assert g1.stats().kv_bytes_per_token == base.stats().kv_bytes_per_token   # SwiftKV alone saves compute, not KV
    # l=15, g=2: 15 own slots + 8 shared group slots = 23 allocations.
    assert g2.stats().kv_bytes_per_token == 23 * 2 * 3 * 64 * 4
    assert len(g2.runner.kv.slots) == 23
    assert g2.runner.num_blocks > base.runner.num_blocks * 1.25           # more tokens for the same memory


def test_l_equal_L_and_disabled_swiftkv_equal_baseline(ckpts, smollm2_dir, tmp_path):
    baseline = engine(smollm2_dir).generate(PROMPTS, GREEDY)
    assert engine(ckpts[1], swiftkv=False).generate(PROMPTS, GREEDY) == baseline
    full = tmp_path / "l30"
    full.mkdir()
    for f in ckpts[1].iterdir():
        (full / f.name).symlink_to(f)
    cfg = json.loads((ckpts[1] / "config.json").read_text())
    cfg["num_key_value_layers"] = cfg["num_hidden_layers"]
    (full / "config.json").unlink()
    (full / "config.json").write_text(json.dumps(cfg))
    eng = engine(full)
    assert not eng.runner.model.use_swiftkv
    assert eng.generate(PROMPTS, GREEDY) == baseline


@pytest.mark.parametrize("g", [1, 2])
def test_mixed_prefill_decode_batch_equals_alone(ckpts, g):
    alone = [engine(ckpts[g]).generate([p], GREEDY)[0] for p in PROMPTS]
    eng = engine(ckpts[g], max_num_batched_tokens=16, block_size=4)
    eng.add_request("a", PROMPTS[0], GREEDY)
    got = {"a": [], "b": [], "c": []}
    mixed_steps = 0
    for step in range(200):
        if step == 3:
            eng.add_request("b", PROMPTS[1], GREEDY)
            eng.add_request("c", PROMPTS[2], GREEDY)
        sched_before = len(eng.scheduler.running)
        outs = eng.step()
        mixed_steps += sched_before >= 2
        for o in outs:
            got[o.request_id] += o.new_token_ids
        if step > 3 and not eng.has_unfinished():
            break
    assert mixed_steps > 0
    assert [got["a"], got["b"], got["c"]] == alone


def _agreement(a, b):
    return [next((i for i, (x, y) in enumerate(zip(p, q)) if x != y), len(p)) for p, q in zip(a, b)]


def test_fp8_kv_composes_with_swiftkv_and_acrosskv(ckpts, smollm2_dir):
    # Real 1-byte storage: 64 bytes of K (or V) per head plus a 4-byte scale.
    eng = engine(ckpts[2], kv_cache_dtype="fp8_e4m3")
    assert eng.stats().kv_bytes_per_token == 23 * 2 * 3 * (64 + 4)
    stored = eng.runner.kv.slots[0].parts[0].k.data
    assert stored.element_size() == 1 and stored.dtype == torch.uint8
    out = eng.generate(PROMPTS, GREEDY)
    assert all(len(o) == N_NEW for o in out)
    # On the baseline model FP8 KV keeps greedy output close to the dense cache.
    dense = engine(smollm2_dir).generate(PROMPTS, GREEDY)
    fp8 = engine(smollm2_dir, kv_cache_dtype="fp8_e4m3").generate(PROMPTS, GREEDY)
    assert sum(_agreement(dense, fp8)) / len(PROMPTS) >= 8
