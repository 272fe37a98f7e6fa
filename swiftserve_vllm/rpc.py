"""``SwiftServeWorkerExtension``: RPC methods the worker calls in vLLM's model processes.

Passed as vLLM's ``worker_extension_cls`` (vLLM mixes it into its worker class), so the
worker reads the plugin model's counters with
``await engine.collective_rpc("swiftserve_counters")`` (one dict per rank) without
pickled functions crossing processes. No vLLM import: the methods only read the model.
"""

from __future__ import annotations


class SwiftServeWorkerExtension:
    def swiftserve_counters(self) -> dict[str, int]:
        """Rows through this rank's head and tail, and tail rows that fast prefill did not narrow
        (prompt tokens that lost SwiftKV's saving); empty for other model classes."""
        model = getattr(self.model_runner.get_model(), "model", None)      # type: ignore[attr-defined]
        if not hasattr(model, "tail_rows_unnarrowed"):
            return {}
        return {"tokens_head": int(model.tokens_head), "tokens_tail": int(model.tokens_tail),
                "tail_rows_unnarrowed": int(model.tail_rows_unnarrowed)}
