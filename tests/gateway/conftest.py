"""Fixtures shared by the gateway's e2e modules.

``worker``: one real reference-engine SmolLM2 worker for every stream-migration module
(``test_gateway_migration*.py``): relays stand in front of it and fail on cue, so the worker
itself is never harmed, and starting it once instead of once per module saves a worker start
(~15 s) per module. Greedy outputs do not depend on what earlier modules sent (prefix-cache
hits give the same tokens: tests/refengine's prefix-cache parity).
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from benchmarks.lib.procs import free_port  # noqa: E402
from fault_support import Proc  # noqa: E402


@pytest.fixture(scope="session")
def worker(smollm2_dir):
    port = free_port()
    w = Proc([sys.executable, "-m", "worker", "--model", str(smollm2_dir), "--port", str(port),
              "--served-model-name", "m", "--max-model-len", "512", "--torch-threads", "1", "--log-level", "warning"],
             f"http://127.0.0.1:{port}").wait_ready(300)
    yield w
    w.kill()
