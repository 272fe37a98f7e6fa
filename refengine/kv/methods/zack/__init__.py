"""ZACK: ``method`` (planning, loading hooks), ``ranks`` (rate -> per-head ranks, NumPy),
``ops`` (QK maps and V/O folds, torch), ``format`` (the checkpoint files, torch-free; also
read by ``modelkit`` and the vLLM plugin)."""
