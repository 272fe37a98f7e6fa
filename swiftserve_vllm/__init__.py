"""SwiftServe's vLLM plugin: SwiftKV (with AcrossKV) and uniform-rank ZACK Llama models.

vLLM calls ``register()`` in every process (entry point ``vllm.general_plugins``, name
``swiftserve``). It checks the installed vLLM against the declared supported range,
teaches transformers the ``llama_swiftkv`` config type, and registers the model class
lazily (``module:Class`` strings: nothing heavy is imported until a model is built):

- ``LlamaSwiftKVForCausalLM``: Snowflake-format SwiftKV checkpoints (what their
  ``config.json`` names), served with SwiftKV (``hf_overrides={"swiftkv": false}`` runs
  the same weights as the original model);
- ``SwiftServeLlamaForCausalLM``: the same class under our own name, for checkpoints whose
  ``architectures`` say plain Llama, e.g. ZACK (``hf_overrides={"architectures": [...]}``).

SwiftKV's prefill saving needs vLLM's ``kv_sharing_fast_prefill`` on (the worker's
``--engine vllm`` turns it on for SwiftKV checkpoints; with ``vllm serve`` pass
``--kv-sharing-fast-prefill``).
"""

from __future__ import annotations

import logging

ARCHITECTURES = ("LlamaSwiftKVForCausalLM", "SwiftServeLlamaForCausalLM")
MODEL_CLASS = "swiftserve_vllm.model:SwiftServeLlamaForCausalLM"
log = logging.getLogger(__name__)


def register() -> None:
    from swiftserve_vllm import compat, hf_config

    compat.check_version()
    hf_config.register()
    for arch in ARCHITECTURES:
        compat.register_model(arch, MODEL_CLASS)
