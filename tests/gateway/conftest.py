"""Fixtures shared by the gateway's e2e modules.

``worker``: one real reference-engine SmolLM2 worker for every stream-migration module
(``test_gateway_migration*.py``): relays stand in front of it and fail on cue, so the worker
itself is never harmed, and starting it once instead of once per module saves a worker start
(~15 s) per module. Greedy outputs do not depend on what earlier modules sent (prefix-cache
hits give the same tokens: tests/refengine/test_prefix_cache_engine.py). Session scope (a
directory without ``__init__.py`` has no narrower shared scope): the idle worker holds its memory,
not the CPU, until the session ends.
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from fault_support import real_worker  # noqa: E402


@pytest.fixture(scope="session")
def worker(smollm2_dir):
    w = real_worker(smollm2_dir, "--log-level", "warning").wait_ready(300)
    yield w
    w.kill()
