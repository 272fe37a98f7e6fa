"""FP8 KV codec: ``method`` only (its storage is the shared ``refengine.kv.storage.Fp8Store``)."""
