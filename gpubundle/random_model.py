"""Random-weights Llama checkpoints on disk, for GPU checks that cannot carry a real model.

``write_random_llama(out_dir, shape, seed, std)`` writes ``config.json`` and
``model.safetensors`` (float32) of a plain Llama (``LlamaForCausalLM``) with the given
shape. Tensors are the reference engine's dummy weights (``refengine.dummy_weights``:
one seed per tensor name, norms 1, biases 0) with the matrices scaled from their std of
0.02 to ``std``: a larger ``std`` gives peaked next-token distributions, so greedy tokens
compared across devices or dtypes are decided by clear margins rather than by rounding.
The same (shape, seed, std) gives the same bytes on every machine.

Shapes used by the GPU session: ``SMOLLM2`` (SmolLM2-135M's exact shape, for a
throughput-only distillation when the real model was not carried) and ``TINY``.
"""

from __future__ import annotations

import json
from pathlib import Path

SMOLLM2 = {"vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
           "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64, "rms_norm_eps": 1e-5,
           "rope_theta": 100000.0, "max_position_embeddings": 8192, "tie_word_embeddings": True}
TINY = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "max_position_embeddings": 4096, "tie_word_embeddings": True}
_DUMMY_STD = 0.02           # refengine.dummy_weights draws matrices with this std


def llama_config(shape: dict) -> dict:
    """A plain Llama ``config.json`` for ``shape`` (ids 1 = BOS, 2 = EOS, as in SmolLM2)."""
    return {**shape, "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
            "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32"}


def write_random_llama(out_dir: str | Path, shape: dict, seed: int = 0, std: float = _DUMMY_STD) -> Path:
    import torch
    from safetensors.torch import save_file

    from refengine.dummy_weights import DummyWeights
    from refengine.model_config import load_model_spec

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(llama_config(shape), indent=1))
    dummy = DummyWeights(load_model_spec(out), seed)
    tensors = {}
    for name in dummy.names():
        t = dummy.get(name, torch.float32)
        tensors[name] = t if t.dim() == 1 else t * (std / _DUMMY_STD)
    save_file(tensors, str(out / "model.safetensors"))
    return out
