"""SnapKV-style eviction: ``method`` (watch windows, compaction after the prompt), ``ops``
(observation-window queries, pooled scores, kept tokens per head)."""
