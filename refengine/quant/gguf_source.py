"""``GGUFWeights``: a GGUF file read as the engine's weight source, quantized tensors kept as stored.

Same interface as ``refengine.weights.WeightSource`` (``name in w``, ``names()``, ``get(name, dtype,
device)`` -> a dense tensor, ``close()``), in Hugging Face tensor names, plus ``get_quant(name)``:
the tensor as a ``QTensor`` (its GGUF blocks, no dequantization) when the file stores it in a
format the kernels run (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K), else None (F32 / F16 / BF16 tensors, names
that only the fallback has). ``get`` of a quantized tensor dequantizes it (llama.cpp's reference
values): for load-time transformations that need floats (ZACK's folds).

Names: llama.cpp's GGUF names (``blk.{i}.attn_q.weight`` ...) mapped back to the HF ones of the
architectures the engine serves: ``llama`` (Llama, Mistral), ``qwen2``, ``qwen3``, ``gemma3``.
Undone on the way: llama.cpp's converter permutes the rows of Llama's Q and K for its rotary
layout (per head, interleaved halves; rows are whole quantized rows, so undoing it is exact) and
stores Gemma's RMSNorm weights with the model's ``+1`` added (subtracted back, in float32).
Tensors the file lacks are read from ``fallback`` (the model directory's safetensors, e.g. a
SwiftKV checkpoint's extra projections); the file wins for every name it has.

``check(spec)`` compares the file's hyper-parameters with the model's config.json and raises
``ValueError`` naming the first difference (a GGUF of another model in the directory).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from refengine.quant import formats
from refengine.quant.qtensor import QTensor

ARCHS = ("llama", "qwen2", "qwen3", "gemma3")
# HF suffix of model.layers.{i}. -> GGUF suffix of blk.{i}. (per architecture where they differ)
_LAYER = {
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias", "self_attn.o_proj.bias": "attn_output.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight", "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
}
_GEMMA_LAYER = {"post_attention_layernorm.weight": "post_attention_norm.weight",
                "pre_feedforward_layernorm.weight": "ffn_norm.weight",
                "post_feedforward_layernorm.weight": "post_ffw_norm.weight"}
_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
_DENSE = {0: np.float32, 1: np.float16, 30: "bf16"}          # GGML_TYPE_F32, F16, BF16


def find_gguf(model_dir: str | Path) -> Path:
    """The one ``*.gguf`` file of a model directory (an error naming what is there otherwise)."""
    files = sorted(Path(model_dir).glob("*.gguf"))
    if len(files) != 1:
        what = ", ".join(f.name for f in files) if files else "none"
        raise FileNotFoundError(f"load_format 'gguf' needs exactly one *.gguf file in {model_dir} (found: {what}); "
                                "for the default model `modelkit prepare` puts its Q4_1 file there, for your own "
                                "GGUF `modelkit gguf-dir FILE --output DIR` makes such a directory")
    return files[0]


def _field(reader, key: str):
    f = reader.fields.get(key)
    if f is None or not f.data:
        return None
    part = f.parts[f.data[0]]
    if f.types and f.types[0].name == "STRING":
        return bytes(part).decode()
    return part.tolist()[0]


class GGUFWeights:
    def __init__(self, path: str | Path, fallback=None) -> None:
        from gguf import GGUFReader

        self.path = Path(path)
        self.reader = GGUFReader(str(self.path), "r")
        self.arch = _field(self.reader, "general.architecture")
        if self.arch not in ARCHS:
            raise ValueError(f"{self.path.name}: GGUF architecture {self.arch!r} is not served (served: {', '.join(ARCHS)})")
        self.n_head = _field(self.reader, f"{self.arch}.attention.head_count")
        self.n_head_kv = _field(self.reader, f"{self.arch}.attention.head_count_kv") or self.n_head
        self._tensors = {t.name: t for t in self.reader.tensors}
        self._hf = {}                                       # HF name -> GGUF name
        layer = dict(_LAYER, **_GEMMA_LAYER) if self.arch == "gemma3" else _LAYER
        for hf, gg in _GLOBAL.items():
            if gg in self._tensors:
                self._hf[hf] = gg
        for gname in self._tensors:
            if gname.startswith("blk."):
                i, rest = gname[4:].split(".", 1)
                for hf_suffix, gg_suffix in layer.items():
                    if gg_suffix == rest:
                        self._hf[f"model.layers.{i}.{hf_suffix}"] = gname
        self.fallback = fallback

    # --- the WeightSource interface -----------------------------------------------------------
    def __contains__(self, name: str) -> bool:
        return name in self._hf or (self.fallback is not None and name in self.fallback)

    def names(self) -> list[str]:
        extra = [n for n in self.fallback.names() if n not in self._hf] if self.fallback is not None else []
        return list(self._hf) + extra

    def get(self, name: str, dtype: torch.dtype | None = None, device: torch.device | str = "cpu") -> torch.Tensor:
        if name not in self._hf:
            if self.fallback is not None and name in self.fallback:
                return self.fallback.get(name, dtype, device)
            raise KeyError(f"{self.path.name} has no tensor for {name!r}")
        q = self.get_quant(name)
        t = q.dequantize() if q is not None else self._dense(name)
        if dtype is not None:
            t = t.to(dtype)
        return t.to(device)

    def get_quant(self, name: str) -> QTensor | None:
        gname = self._hf.get(name)
        if gname is None:
            return None
        t = self._tensors[gname]
        fmt = formats.BY_GGML_TYPE.get(int(t.tensor_type))
        if fmt is None:
            if int(t.tensor_type) not in _DENSE:
                raise ValueError(f"{self.path.name}: {gname} is stored as {t.tensor_type.name}; served formats are "
                                 f"{', '.join(formats.FORMATS)} and F32/F16/BF16")
            return None
        cols = int(t.shape[0])                              # GGUF shapes list the fastest dimension first
        raw = torch.from_numpy(np.array(t.data, dtype=np.uint8, copy=True)).reshape(-1, formats.row_bytes(fmt.name, cols))
        return QTensor(fmt.name, self._unpermute(name, raw), cols)

    def stored_dense(self, name: str) -> bool:
        """The file holds ``name`` unquantized (F32 / F16 / BF16): serve it dense, never requantize it."""
        gname = self._hf.get(name)
        return gname is not None and int(self._tensors[gname].tensor_type) in _DENSE

    def close(self) -> None:
        if self.fallback is not None:
            self.fallback.close()

    # --- helpers --------------------------------------------------------------------------------
    def _dense(self, name: str) -> torch.Tensor:
        t = self._tensors[self._hf[name]]
        kind = _DENSE[int(t.tensor_type)]
        shape = [int(s) for s in reversed(t.shape)]
        if kind == "bf16":
            arr = np.array(t.data, copy=True).view(np.int16)
            x = torch.from_numpy(arr).view(torch.bfloat16).float()
        else:
            x = torch.from_numpy(np.array(t.data, dtype=kind, copy=True)).float()
        x = self._unpermute(name, x.reshape(shape))
        if self.arch == "gemma3" and name.endswith("norm.weight"):
            x = x - 1.0                                     # the converter stored 1 + w
        return x

    def _unpermute(self, name: str, rows: torch.Tensor) -> torch.Tensor:
        """Undo llama.cpp's Q/K row order (``llama`` architecture only): within each head, its
        stored row 2t + s is the checkpoint's row s * (head_dim / 2) + t."""
        if self.arch != "llama" or not (name.endswith("q_proj.weight") or name.endswith("k_proj.weight")):
            return rows
        heads = self.n_head if name.endswith("q_proj.weight") else self.n_head_kv
        n = rows.shape[0]
        hd = n // heads
        idx = torch.arange(n).reshape(heads, hd // 2, 2).transpose(1, 2).reshape(n)
        return rows.index_select(0, idx)

    def check(self, spec) -> None:
        """Raise ValueError when the file's shape is not the model config's."""
        a = self.arch
        want = {f"{a}.block_count": spec.num_layers, f"{a}.embedding_length": spec.hidden_size,
                f"{a}.attention.head_count": spec.num_heads, f"{a}.attention.head_count_kv": spec.num_kv_heads}
        for key, value in want.items():
            got = _field(self.reader, key)
            if got is not None and int(got) != int(value):
                raise ValueError(f"{self.path.name}: {key} = {got}, but the model's config.json says {value}: "
                                 "the GGUF is not this model")
        emb = self._tensors.get("token_embd.weight")
        if emb is not None and int(emb.shape[1]) != spec.vocab_size:
            raise ValueError(f"{self.path.name}: vocabulary of {int(emb.shape[1])} tokens, config.json says {spec.vocab_size}")

    def formats_used(self) -> dict[str, int]:
        """Tensor count per storage format (for the start-up log)."""
        out: dict[str, int] = {}
        for t in self._tensors.values():
            out[t.tensor_type.name] = out.get(t.tensor_type.name, 0) + 1
        return out
