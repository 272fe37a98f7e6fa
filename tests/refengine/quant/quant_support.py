"""Helpers of the quantization tests: random GGUF blocks, and tiny random GGUF models written as
llama.cpp's converter writes them (Q/K rows permuted, norms F32), with gguf-py's writer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from refengine.quant import formats

SCALE_OFFSETS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q8_0": (0,), "Q4_K": (0, 2), "Q6_K": (208,)}


def random_blocks(qtype: str, rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    """Random bytes for every field, fp16 scales finite and of weight-like size (some negative:
    a Q4_1 min or Q6_K scale can be), so every bit pattern of the integer fields is exercised."""
    g = torch.Generator().manual_seed(seed)
    f = formats.FORMATS[qtype]
    raw = torch.randint(0, 256, (rows * cols // f.block, f.block_bytes), dtype=torch.uint8, generator=g)
    for off in SCALE_OFFSETS[qtype]:
        d = (torch.rand(raw.shape[0], generator=g) * 0.05 + 1e-4) * torch.where(
            torch.rand(raw.shape[0], generator=g) < 0.2, -1.0, 1.0)
        raw[:, off:off + 2] = d.to(torch.float16).view(torch.uint8).reshape(-1, 2)
    return raw.reshape(rows, -1)


def llama_permute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's converter's Q/K row order (the inverse of what GGUFWeights undoes)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


TINY_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
              "intermediate_size": 512, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 64, "hidden_act": "silu", "vocab_size": 320, "max_position_embeddings": 512,
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True, "bos_token_id": 1,
              "eos_token_id": 2, "torch_dtype": "float32"}


def write_tiny_llama(out: Path, qtype: str, seed: int = 0, v_type: str | None = None) -> dict[str, torch.Tensor]:
    """A random tiny Llama as ``out/config.json`` + ``out/model.safetensors`` (float32) + ``out/tiny.gguf``
    (linear weights and the embedding in ``qtype``, attn_v in ``v_type`` when given, like a K-quant
    mix); returns the HF state dict of the *dequantized* weights (what the GGUF holds)."""
    import gguf
    from safetensors.torch import save_file

    cfg = TINY_LLAMA
    g = torch.Generator().manual_seed(seed)
    H, I, L, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    rnd = lambda *s: torch.randn(*s, generator=g) * 0.1  # noqa: E731
    hf = {"model.embed_tokens.weight": rnd(V, H), "model.norm.weight": 1 + rnd(H)}
    for i in range(L):
        p = f"model.layers.{i}."
        hf.update({p + "input_layernorm.weight": 1 + rnd(H), p + "post_attention_layernorm.weight": 1 + rnd(H),
                   p + "self_attn.q_proj.weight": rnd(nh * hd, H), p + "self_attn.k_proj.weight": rnd(nkv * hd, H),
                   p + "self_attn.v_proj.weight": rnd(nkv * hd, H), p + "self_attn.o_proj.weight": rnd(H, nh * hd),
                   p + "mlp.gate_proj.weight": rnd(I, H), p + "mlp.up_proj.weight": rnd(I, H),
                   p + "mlp.down_proj.weight": rnd(H, I)})
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    for i in range(L):
        for hf_s, gg_s in (("input_layernorm", "attn_norm"), ("post_attention_layernorm", "ffn_norm"),
                           ("self_attn.q_proj", "attn_q"), ("self_attn.k_proj", "attn_k"), ("self_attn.v_proj", "attn_v"),
                           ("self_attn.o_proj", "attn_output"), ("mlp.gate_proj", "ffn_gate"), ("mlp.up_proj", "ffn_up"),
                           ("mlp.down_proj", "ffn_down")):
            names[f"model.layers.{i}.{hf_s}.weight"] = f"blk.{i}.{gg_s}.weight"
    w = gguf.GGUFWriter(str(out / "tiny.gguf"), "llama")
    w.add_block_count(L)
    w.add_embedding_length(H)
    w.add_feed_forward_length(I)
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_rope_dimension_count(hd)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg["rope_theta"])
    dequant = {}
    for name, t in hf.items():
        if t.dim() == 1:
            w.add_tensor(names[name], t.numpy().astype(np.float32))
            dequant[name] = t
            continue
        qt = v_type if (v_type and "v_proj" in name) else qtype
        raw = formats.quantize(qt, t)
        dequant[name] = formats.dequantize(qt, raw, t.shape[1])
        stored = raw
        if "q_proj" in name or "k_proj" in name:
            stored = llama_permute(raw, nh if "q_proj" in name else nkv)
        w.add_tensor(names[name], stored.numpy(), raw_dtype=gguf.GGMLQuantizationType[qt])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    (out / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in dequant.items()}, str(out / "model.safetensors"))
    return dequant
