"""transformers config class for Snowflake's ``llama_swiftkv`` model type.

Module level (not defined inside a function) because vLLM pickles the HF config into its
engine-core process. The three SwiftKV fields are kept as attributes; everything else
is Llama's.
"""

from __future__ import annotations

from transformers import LlamaConfig


class LlamaSwiftKVConfig(LlamaConfig):
    model_type = "llama_swiftkv"

    def __init__(self, swiftkv: bool = False, num_key_value_layers: int | None = None,
                 key_value_group_size: int = 1, **kwargs):
        self.swiftkv = swiftkv
        self.num_key_value_layers = num_key_value_layers
        self.key_value_group_size = key_value_group_size
        super().__init__(**kwargs)


def register() -> None:
    from transformers import AutoConfig

    try:
        AutoConfig.register("llama_swiftkv", LlamaSwiftKVConfig)
    except ValueError:      # already registered in this process
        pass
