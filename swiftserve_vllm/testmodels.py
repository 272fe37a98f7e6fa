"""Test checkpoints for the plugin's checks (torch only, no vLLM), written from real weights.

    python -m swiftserve_vllm.testmodels OUT      # writes OUT/<name> for every name below

- ``zack-r32``: ZACK rank 32 of 64 over the base model (rotations from the weights' SVD);
- ``zack-full-g2``: ZACK at full rank with random rotations over SwiftKV g=2 (changes no token);
- ``tp-g1``, ``tp-g2``: the shipped SwiftKV g=1 / g=2 with KV heads 0-1 only (6 query / 2 KV
  heads: SmolLM2's 3 KV heads do not split over 2 tensor-parallel ranks);
- ``tp-zack``: ZACK rank 32 over ``tp-g2`` (SwiftKV, AcrossKV, ZACK and TP in one model);
- ``tp-zack-lw``: layer-wise ZACK over ``tp-g2``: rank 64 or 32 by layer (equal within a group),
  so vLLM holds caches of two head sizes;
- ``qwen2-swiftkv``, ``qwen3-swiftkv``: tiny random Qwen2 (q/k/v biases) and Qwen3 (QK-norm)
  models (4 query / 2 KV heads of 64, 4 layers, SmolLM2's tokenizer) converted by
  ``modelkit convert-swiftkv`` (l=2; g=2 for Qwen3, so a group shares its leader's k_norm).
Existing directories are reused.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from swiftserve_vllm.layout import parse_layout
from swiftserve_vllm.reference import _link, _weights, make_random_zack

NAMES = ("zack-r32", "zack-full-g2", "tp-g1", "tp-g2", "tp-zack", "tp-zack-lw", "qwen2-swiftkv", "qwen3-swiftkv")
# layer-wise ranks of tp-zack-lw: layers < 15 alternate in threes, the AcrossKV groups {15,16}, ... in turns
LAYERWISE = [64 if (i < 15 and i % 3 == 0) or (i >= 15 and (i - 15) // 2 % 2 == 0) else 32 for i in range(30)]


def prune_kv_heads(base: str | Path, out: str | Path, keep: list[int]) -> Path:
    """A smaller real model for tensor-parallel tests: ``base`` with only the KV heads ``keep``
    (and their query heads) in every attention projection, SwiftKV's included; the rest of the
    weights and the tokenizer files are kept. SmolLM2's 3 KV heads do not split over 2 ranks;
    keeping 2 of them gives 6 query / 2 KV heads, a model whose logits stay peaked (greedy
    parity between layouts is meaningful), unlike random weights."""
    from safetensors.torch import save_file

    base, out = Path(base), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((base / "config.json").read_text())
    lay = parse_layout(cfg, use_swiftkv=False)
    group, d = lay.num_heads // lay.num_kv_heads, lay.head_dim
    kv_rows = torch.cat([torch.arange(h * d, (h + 1) * d) for h in keep])
    q_rows = torch.cat([torch.arange(q * d, (q + 1) * d) for h in keep for q in range(h * group, (h + 1) * group)])
    tensors = {}
    for name, t in _weights(base).items():
        if name.endswith(("q_proj.weight", "q_proj_swiftkv.weight")):
            t = t[q_rows]
        elif name.endswith(("k_proj.weight", "v_proj.weight", "k_proj_swiftkv.weight", "v_proj_swiftkv.weight")):
            t = t[kv_rows]
        elif name.endswith("o_proj.weight"):
            t = t[:, q_rows]
        tensors[name] = t.contiguous()
    save_file(tensors, str(out / "model.safetensors"))
    for f in base.iterdir():
        if f.is_file() and not f.name.endswith((".safetensors", ".safetensors.index.json")) \
                and f.name != "config.json" and not (out / f.name).exists():
            _link(f, out / f.name)
    cfg.update(num_attention_heads=len(keep) * group, num_key_value_heads=len(keep), head_dim=d)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


def random_family_swiftkv(family: str, tokenizer_dir: Path, out: Path, l: int, g: int, seed: int = 0) -> Path:
    """A tiny random ``family`` model (transformers' own initialisation, a wider std so that logits
    are peaked enough for greedy parity), converted to SwiftKV ``l``/``g`` in ``out``."""
    import transformers as tf

    from modelkit.swiftkv import write_swiftkv_checkpoint

    common = dict(vocab_size=49152, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=2048,
                  bos_token_id=1, eos_token_id=2, initializer_range=0.06, tie_word_embeddings=True)
    cfg, cls = {"qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM), "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM)}[family]
    torch.manual_seed(seed)
    base = out.parent / f"{out.name}-base"
    cls(cfg(**common)).save_pretrained(base)
    for f in tokenizer_dir.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")) and not (base / f.name).exists():
            _link(f, base / f.name)
    return write_swiftkv_checkpoint(base, out, l, g)


def make_test_models(out: str | Path, names=NAMES) -> dict[str, Path]:
    """The test checkpoints ``names`` (default: all of ``NAMES``) and those they are made from, under
    ``out`` (made once; later calls reuse them)."""
    from modelkit.models import resolve_model

    out = Path(out)
    base, g1, g2 = (resolve_model(n) for n in ("default", "SmolLM2-135M-Instruct-SwiftKV",
                                               "SmolLM2-135M-Instruct-SwiftKV-AcrossKV2"))
    made: dict[str, Path] = {}

    def once(name, fn):
        d = out / name
        made[name] = d if (d / "config.json").is_file() else fn(d)

    makers = {
        "zack-r32": lambda d: make_random_zack(base, d, 32, kind="weights"),
        "zack-full-g2": lambda d: make_random_zack(g2, d, 64, seed=1, kind="random"),
        "tp-g1": lambda d: prune_kv_heads(g1, d, [0, 1]),
        "tp-g2": lambda d: prune_kv_heads(g2, d, [0, 1]),
        "tp-zack": lambda d: make_random_zack(made["tp-g2"], d, 32, kind="weights"),
        "tp-zack-lw": lambda d: make_random_zack(made["tp-g2"], d, LAYERWISE, kind="weights"),
        "qwen2-swiftkv": lambda d: random_family_swiftkv("qwen2", base, d, 2, 1),
        "qwen3-swiftkv": lambda d: random_family_swiftkv("qwen3", base, d, 2, 2),
    }
    wanted = set(names) | ({"tp-g2"} if {"tp-zack", "tp-zack-lw"} & set(names) else set())
    for name in makers:                       # NAMES order: tp-g2 before the models made from it
        if name in wanted:
            once(name, makers[name])
    return made


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1].startswith("-"):
        sys.exit(__doc__.split("\n\n")[1])
    for name, path in make_test_models(sys.argv[1]).items():
        print(name, path)
