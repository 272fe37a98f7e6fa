"""KV methods, one module each (registered in ``refengine.kv.registry``)."""
