"""SwiftServe's vLLM plugin: SwiftKV (with AcrossKV) and ZACK for Llama, Mistral, Qwen2 and Qwen3.

vLLM calls ``register()`` in every process (entry point ``vllm.general_plugins``, name
``swiftserve``). It checks the installed vLLM against the declared supported range,
teaches transformers the ``*_swiftkv`` config types, and registers the model class
lazily (``module:Class`` strings: nothing heavy is imported until a model is built):

- ``LlamaSwiftKVForCausalLM``, ``Qwen2SwiftKVForCausalLM``, ``Qwen3SwiftKVForCausalLM``:
  Snowflake-format SwiftKV checkpoints of those families (what their ``config.json``
  names), served with SwiftKV (``hf_overrides={"swiftkv": false}`` runs
  the same weights as the original model);
- ``SwiftServeLlamaForCausalLM``: the same class under our own name, for checkpoints whose
  ``architectures`` name the plain family, e.g. ZACK (``hf_overrides={"architectures": [...]}``);
  the family comes from ``model_type``.

On CPU it also mends vLLM's rewind of a seeded request's generator when its prefill is
chunked (``compat.fix_seeded_chunked_prefill_on_cpu``: without it the engine dies).

On GPUs vLLM 0.26+ would run newer models on its Model Runner V2; for the plugin's classes it
picks the V1 runner, where the plugin's runner patches are verified, and logs why
(``compat.prefer_v1_model_runner``; ``VLLM_USE_V2_MODEL_RUNNER=1`` is refused with that reason).

SwiftKV's prefill saving needs vLLM's ``kv_sharing_fast_prefill`` on (the worker's
``--engine vllm`` turns it on for SwiftKV checkpoints; with ``vllm serve`` pass
``--kv-sharing-fast-prefill``).
"""

from __future__ import annotations

import logging

ARCHITECTURES = ("LlamaSwiftKVForCausalLM", "Qwen2SwiftKVForCausalLM", "Qwen3SwiftKVForCausalLM",
                 "SwiftServeLlamaForCausalLM")
MODEL_CLASS = "swiftserve_vllm.model:SwiftServeLlamaForCausalLM"
# What vLLM logs when it picks its V1 runner for the plugin's classes, and refuses a forced V2 with.
V2_RUNNER_REASON = ("SwiftServe's SwiftKV/ZACK model classes (verified on the V1 model runner only: "
                    "compat.fix_kv_sharing_in_mixed_head_groups and SwiftKV's fast-prefill tail)")
log = logging.getLogger(__name__)


def register() -> None:
    from swiftserve_vllm import compat, hf_config

    compat.check_version()
    hf_config.register()
    compat.prefer_v1_model_runner(ARCHITECTURES, V2_RUNNER_REASON)
    if compat.platform_device() == "cpu":
        compat.fix_seeded_chunked_prefill_on_cpu()
    for arch in ARCHITECTURES:
        compat.register_model(arch, MODEL_CLASS)
