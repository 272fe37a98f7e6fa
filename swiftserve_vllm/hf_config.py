"""transformers config classes for the SwiftKV model types: Snowflake's ``llama_swiftkv`` and the
same format on Qwen2 and Qwen3 (``qwen2_swiftkv``, ``qwen3_swiftkv``, see docs/models.md).

Module level (not defined inside a function) because vLLM pickles the HF config into its
engine-core process. The three SwiftKV fields are kept as attributes; everything else
is Llama's.
"""

from __future__ import annotations

from transformers import LlamaConfig, Qwen2Config, Qwen3Config


class _SwiftKVFields:
    def _swiftkv(self, swiftkv: bool, num_key_value_layers: int | None, key_value_group_size: int) -> None:
        self.swiftkv = swiftkv
        self.num_key_value_layers = num_key_value_layers
        self.key_value_group_size = key_value_group_size


class LlamaSwiftKVConfig(LlamaConfig, _SwiftKVFields):
    model_type = "llama_swiftkv"

    def __init__(self, swiftkv: bool = False, num_key_value_layers: int | None = None,
                 key_value_group_size: int = 1, **kwargs):
        self._swiftkv(swiftkv, num_key_value_layers, key_value_group_size)
        super().__init__(**kwargs)


class Qwen2SwiftKVConfig(Qwen2Config, _SwiftKVFields):
    model_type = "qwen2_swiftkv"

    def __init__(self, swiftkv: bool = False, num_key_value_layers: int | None = None,
                 key_value_group_size: int = 1, **kwargs):
        self._swiftkv(swiftkv, num_key_value_layers, key_value_group_size)
        super().__init__(**kwargs)


class Qwen3SwiftKVConfig(Qwen3Config, _SwiftKVFields):
    model_type = "qwen3_swiftkv"

    def __init__(self, swiftkv: bool = False, num_key_value_layers: int | None = None,
                 key_value_group_size: int = 1, **kwargs):
        self._swiftkv(swiftkv, num_key_value_layers, key_value_group_size)
        super().__init__(**kwargs)


def register() -> None:
    from transformers import AutoConfig

    for cls in (LlamaSwiftKVConfig, Qwen2SwiftKVConfig, Qwen3SwiftKVConfig):
        try:
            AutoConfig.register(cls.model_type, cls)
        except ValueError:      # already registered in this process
            pass
