"""Engine backends behind ``worker.engine_client.EngineClient``.

``create_engine_client(worker_config)`` picks the backend named by
``worker_config.engine`` ("reference"; "vllm" once its backend lands). Imports are
lazy so that a worker only loads the stack it uses.
"""

from __future__ import annotations


def create_engine_client(worker_config):
    kind = getattr(worker_config, "engine", "reference")
    if kind == "reference":
        from worker.backends.reference import ReferenceEngineClient

        return ReferenceEngineClient(worker_config.engine_config)
    raise ValueError(f"unknown engine {kind!r} (available: reference)")
