"""KV methods, one package each (registered in ``refengine.kv.registry``).

Each ``<name>/`` holds ``method.py`` (the ``KVMethod`` subclass: options, planning and
serving hooks; no torch at import time, so the registry and the worker's start-up checks
stay light) and, where the method has them, ``ops.py`` (its tensor work, imported when
the model loads) and its own parts (``format``, ``ranks``, ``store``, ``layout``,
``staging``). A method package imports the shared layer (``refengine.kv.base``, ``spec``,
``storage``, ``cache``) and ``refengine.attention``, never another method package.
"""
