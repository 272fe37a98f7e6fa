"""``modelkit quantize``: an int8 W8A8 checkpoint in the compressed-tensors format vLLM reads.

Every linear layer of the decoder (q/k/v/o, gate/up/down, and a SwiftKV checkpoint's
``q/k/v_proj_swiftkv``) gets symmetric per-output-channel int8 weights (``X.weight`` int8,
``X.weight_scale`` float32 ``[out, 1]``); activations are quantized per token at run time
(``input_activations``: dynamic, strategy token). The embedding, norms and ``lm_head`` stay
as they were (``ignore: ["lm_head"]``). config.json keeps every key and gains
``quantization_config`` (``quant_method: compressed-tensors``, ``format: int-quantized``).

SmoothQuant (``--smooth ALPHA``, 0 = off): activation outliers are moved into the weights
before quantizing. For each input channel j of the layers that read one RMSNorm's output,
``s_j = max|x_j|^alpha / max|W[:, j]|^(1 - alpha)`` (max over calibration tokens and over the
rows of every such layer); the norm weight is divided by s (``(1 + w)`` norms: ``1 + w``) and
the layers' columns multiplied by it, which changes nothing in float arithmetic. Groups: each
layer's ``input_layernorm`` -> q/k/v (and ``q_proj_swiftkv``), its pre-MLP norm -> gate/up, and
``down_proj``'s input -> folded into ``up_proj``'s rows (silu(g) * u / s). ``o_proj`` is not
smoothed (its input is V, shared by a group's query heads). The statistics come from the model
served by the reference engine on calibration text (the local corpus sources of
``modelkit.corpus``, or ``--corpus``), prefilled with prompt log-probs, so a SwiftKV model's later
layers see every token (but each sequence's last).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
              "generation_config.json", "tokenizer.model")
QUANTIZED = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
             "mlp.up_proj", "mlp.down_proj", "self_attn.q_proj_swiftkv", "self_attn.k_proj_swiftkv",
             "self_attn.v_proj_swiftkv")


def quantization_config(ignore: list[str]) -> dict:
    scheme = {"num_bits": 8, "type": "int", "symmetric": True, "group_size": None, "block_structure": None,
              "actorder": None, "observer_kwargs": {}}
    return {
        "quant_method": "compressed-tensors", "format": "int-quantized", "quantization_status": "compressed",
        "config_groups": {"group_0": {
            "targets": ["Linear"], "output_activations": None,
            "weights": dict(scheme, strategy="channel", dynamic=False, observer="minmax"),
            "input_activations": dict(scheme, strategy="token", dynamic=True, observer=None)}},
        "ignore": ignore, "kv_cache_scheme": None, "global_compression_ratio": None,
    }


def _is_quantized(name: str) -> bool:
    return name.endswith(".weight") and any(f".{q}.weight" in name for q in QUANTIZED)


def watch_linear_inputs(model, stats: dict) -> list:
    """Forward pre-hooks on every decoder layer of the reference engine's ``model`` that keep, in
    ``stats``, the max |x| per input channel of q/k/v (``(i, "attn")``), gate/up (``(i, "mlp")``) and
    down (``(i, "down")``) over every row they see; returns the hooks' handles."""
    def hook(key):
        def record(_mod, args):
            x = args[0].detach().reshape(-1, args[0].shape[-1]).abs().amax(0).float()
            stats[key] = torch.maximum(stats[key], x) if key in stats else x
        return record

    handles = []
    for i, layer in enumerate(model.layers):
        attn_in = layer.q_proj if layer.swiftkv_later else layer.qkv_proj
        handles += [attn_in.register_forward_pre_hook(hook((i, "attn"))),
                    layer.gate_up.register_forward_pre_hook(hook((i, "mlp"))),
                    layer.down.register_forward_pre_hook(hook((i, "down")))]
    return handles


def activation_maxima(model_dir: Path, tokens: int, seq_len: int, corpus: Path | None, progress: bool) -> dict:
    """Per layer and input, the max |x| per channel over calibration tokens: keys ``(i, "attn")``
    (the input layernorm's output, read by q/k/v), ``(i, "mlp")`` (gate/up's input), ``(i, "down")``."""
    from tqdm import tqdm
    from transformers import AutoTokenizer

    from modelkit.zack_calibrate import calibration_sequences
    from refengine.config import EngineConfig
    from refengine.engine import LLMEngine
    from refengine.sampling_params import SamplingParams

    tok = AutoTokenizer.from_pretrained(model_dir)
    seqs = calibration_sequences(tok, tokens, seq_len, 0, corpus)
    eng = LLMEngine(EngineConfig(model=str(model_dir), dtype="float32", packed_linear="off", max_model_len=seq_len + 2,
                                 max_num_seqs=8, kv_cache_memory_gb=0.5))
    stats: dict = {}
    handles = watch_linear_inputs(eng.runner.model, stats)
    # Prompt log-probs make every prompt row run every layer in the prefill pass itself (SwiftKV's
    # later layers included), so one pass per sequence sees what teacher-forcing each token as a
    # decode step did, ~9x faster (SwiftKV g=2, `--smooth 0.5`, 16k tokens: 35 s in all here).
    # Each sequence's last token is left out, as that scoring left it out (no row predicts past the
    # end), so the statistics, and the checkpoints quantized before, stay the same.
    every_row = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    try:
        for i in tqdm(range(0, len(seqs), 8), desc="calibration", unit="batch", disable=not progress):
            eng.generate([s[:-1] for s in seqs[i:i + 8]], every_row)
    finally:
        for h in handles:
            h.remove()
    return stats


def _smooth(state: dict, cols: list[str], norm: str | None, rows_of: str | None, amax_x: torch.Tensor,
            alpha: float, offset: float) -> None:
    """Scale columns of ``cols`` by s and divide ``norm`` (or the rows of ``rows_of``) by it, in place."""
    w_max = torch.stack([state[c].float().abs().amax(0) for c in cols]).amax(0)
    s = (amax_x.clamp_min(1e-5) ** alpha / w_max.clamp_min(1e-5) ** (1 - alpha)).clamp(1e-2, 1e2)
    for c in cols:
        state[c] = state[c].float() * s.unsqueeze(0)
    if norm is not None:
        state[norm] = (state[norm].float() + offset) / s - offset
    if rows_of is not None:
        state[rows_of] = state[rows_of].float() / s.unsqueeze(1)
        bias = rows_of[:-len("weight")] + "bias"
        if bias in state:
            state[bias] = state[bias].float() / s


def quantize_w8a8(model_dir: Path, out_dir: Path, smooth: float = 0.0, tokens: int = 16384, seq_len: int = 512,
                  corpus: Path | None = None, progress: bool = True) -> Path:
    """Write the W8A8 checkpoint of ``model_dir`` into ``out_dir``; returns ``out_dir``."""
    from safetensors.torch import save_file

    from refengine.model_config import load_model_spec
    from refengine.quant.int8 import Int8Weight
    from refengine.weights import WeightSource

    cfg = json.loads((model_dir / "config.json").read_text())
    if cfg.get("quantization_config"):
        raise ValueError(f"{model_dir} is already quantized ({cfg['quantization_config'].get('quant_method')})")
    spec = load_model_spec(model_dir)
    w = WeightSource(model_dir)
    state = {n: w.get(n) for n in w.names()}
    w.close()
    if smooth > 0:
        stats = activation_maxima(model_dir, tokens, seq_len, corpus, progress)
        pre_mlp = "pre_feedforward_layernorm" if spec.sandwich_norm else "post_attention_layernorm"
        for i in range(spec.num_layers):
            p = f"model.layers.{i}."
            attn = [p + f"self_attn.{n}.weight" for n in ("q_proj", "k_proj", "v_proj", "q_proj_swiftkv")
                    if p + f"self_attn.{n}.weight" in state]
            _smooth(state, attn, p + "input_layernorm.weight", None, stats[(i, "attn")], smooth, spec.norm_offset)
            _smooth(state, [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"], p + f"{pre_mlp}.weight", None,
                    stats[(i, "mlp")], smooth, spec.norm_offset)
            _smooth(state, [p + "mlp.down_proj.weight"], None, p + "mlp.up_proj.weight", stats[(i, "down")], smooth, 0.0)
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        if _is_quantized(name):
            q = Int8Weight.quantize(t)
            out[name] = q.q.contiguous()
            out[name + "_scale"] = q.scale.reshape(-1, 1).float().contiguous()
        else:
            out[name] = t.contiguous()
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(out, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    cfg["quantization_config"] = quantization_config(["lm_head"])
    if smooth > 0:
        cfg["swiftserve_smoothquant"] = {"alpha": smooth, "calibration_tokens": tokens, "seq_len": seq_len}
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    for f in SIDE_FILES:
        if (model_dir / f).is_file():
            shutil.copy2(model_dir / f, out_dir / f)
    return out_dir
