"""Model shapes the serving suite runs with random weights (``--load-format dummy`` on both servers).

``llama_1b_dir(tokenizer_dir, root=None) -> Path`` returns ``<root>/llama-1b-shape`` (root: the
models folder of the cache, ``~/.cache/swiftserve/models`` by default, ``SWIFTSERVE_CACHE``
moves it), a model directory without weights: ``config.json`` = ``LLAMA_1B`` and SmolLM2's
tokenizer files copied from ``tokenizer_dir`` (the resolved default model directory).
``LLAMA_1B`` is a Llama of ~1.07B parameters: hidden 2048, 16 layers, 32 query / 8 KV heads
of head dim 64, intermediate 8192, SmolLM2's vocabulary (49152) with tied embeddings, RoPE
theta 100000 like SmolLM2's.

Contract: idempotent (a second call rewrites nothing and copies only tokenizer files that are
missing or differ); it refuses (``ValueError``) a directory whose ``config.json`` is not
``LLAMA_1B`` (it never overwrites someone else's model) and a tokenizer directory whose
vocabulary size is not 49152. ``config.json`` is written last (temporary file + rename), so a
directory that has it has its tokenizer too.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

NAME_1B = "llama-1b-shape"
VOCAB = 49152
LLAMA_1B: dict = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 64, "intermediate_size": 8192, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
    "vocab_size": VOCAB, "tie_word_embeddings": True, "rms_norm_eps": 1e-05,
    "rope_theta": 100000.0, "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
    "max_position_embeddings": 8192, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2,
    "initializer_range": 0.02, "torch_dtype": "bfloat16", "use_cache": True,
}
# Tokenizer and generation files (never weights); the first two must exist in the source.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "generation_config.json")


def default_root() -> Path:
    from swiftcommon import envs

    return envs.cache_dir() / "models"


def llama_1b_dir(tokenizer_dir: str | Path, root: str | Path | None = None) -> Path:
    """The weightless ~1B Llama directory (see the module docstring), written on first use."""
    src, out = Path(tokenizer_dir), Path(root or default_root()) / NAME_1B
    cfg = out / "config.json"
    if cfg.exists() and json.loads(cfg.read_text()) != LLAMA_1B:
        raise ValueError(f"{cfg} exists and is not the 1B Llama shape of benchmarks/lib/model_shapes.py; "
                         "move it away (this helper never overwrites another model's config)")
    missing = [f for f in TOKENIZER_FILES[:2] if not (src / f).is_file()]
    if missing:
        raise ValueError(f"{src} has no {', '.join(missing)}: not a tokenizer directory")
    if (src / "config.json").is_file():
        vocab = json.loads((src / "config.json").read_text()).get("vocab_size")
        if vocab != VOCAB:
            raise ValueError(f"{src}: vocab_size {vocab}, the 1B shape is built for SmolLM2's {VOCAB}")
    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        s, d = src / name, out / name
        if s.is_file() and (not d.is_file() or d.read_bytes() != s.read_bytes()):
            shutil.copyfile(s, d)
    if not cfg.exists():
        tmp = out / f".config.json.{os.getpid()}"
        tmp.write_text(json.dumps(LLAMA_1B, indent=2) + "\n")
        tmp.replace(cfg)
    return out
