"""A servable model directory around a GGUF file, the weights left in the file.

``make_gguf_dir(gguf, out, tokenizer_from=None)`` writes ``out/config.json`` (from the GGUF's
metadata, read by transformers' GGUF support, in the portable form ``modelkit.prepare`` writes)
and the tokenizer (the GGUF's own, or copied from ``tokenizer_from``), and links the GGUF into
``out`` (hard link, else a copy). The reference engine then serves it with
``--load-format gguf`` (refengine.quant), the quantized blocks as stored. No weight is
dequantized here. Refuses an architecture the engine does not serve.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from refengine.quant.gguf_source import ARCHS, GGUFWeights

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "generation_config.json", "tokenizer.model")


def make_gguf_dir(gguf: Path, out: Path, tokenizer_from: Path | None = None) -> Path:
    from transformers import AutoConfig, AutoTokenizer

    from modelkit.prepare import _portable_config

    gguf = gguf.expanduser().resolve()
    if not gguf.is_file():
        raise FileNotFoundError(f"no such GGUF file: {gguf}")
    arch = GGUFWeights(gguf).arch                  # raises for architectures we do not serve
    if arch not in ARCHS:
        raise ValueError(f"GGUF architecture {arch!r} not served")
    out.mkdir(parents=True, exist_ok=True)
    cfg = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    cfg_dict = _portable_config(cfg.to_dict(), cfg.architectures[0] if cfg.architectures else "LlamaForCausalLM")
    cfg_dict.pop("dtype", None)
    cfg_dict["torch_dtype"] = "float32"
    if tokenizer_from is not None:
        for f in TOKENIZER_FILES:
            if (tokenizer_from / f).is_file():
                shutil.copy2(tokenizer_from / f, out / f)
    else:
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)
    dst = out / gguf.name
    if dst.exists():
        dst.unlink()
    try:
        os.link(gguf, dst)
    except OSError:
        shutil.copy2(gguf, dst)
    (out / "config.json").write_text(json.dumps(cfg_dict, indent=2, sort_keys=True) + "\n")
    return out
