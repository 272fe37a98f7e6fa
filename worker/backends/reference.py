"""The reference engine as the worker's EngineClient.

``--engine-core process`` (default): ``refengine.engine_process.ProcessEngine``, the engine
core in its own process, so the HTTP layer (detokenisation, SSE) does not take the GIL
from the engine. ``thread``: ``refengine.async_engine.AsyncEngine``, the engine on a
background thread of the worker process (one process, shares the GIL).
"""

from __future__ import annotations

from refengine.engine_process import engine_client


def reference_engine_client(worker_config):
    return engine_client(worker_config.engine_config, worker_config.engine_core, worker_config.engine_step_timeout)
