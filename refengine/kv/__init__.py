"""The KV-method layer of the reference engine (see ``registry`` for the composition rules).

- ``spec``      torch-free: per-slot, per-head dimensions, codec and placement; bytes per token.
- ``base``      the ``KVMethod`` interface (planning, loading and serving hooks).
- ``registry``  the registered methods, ``--kv-methods`` parsing and validation, planning.
- ``storage``   paged storage codecs (dense, fp8).
- ``cache``     the engine's cache built from a spec: what model layers write to and attend over.
- ``methods/``  one package per method (fp8, zack, zipcache, kcache, eviction): its
                ``method``, ``ops`` and own parts; nothing method-specific lives here.
"""
