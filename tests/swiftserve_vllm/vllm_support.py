"""Shared by the vLLM tests: where the vLLM environment is, and the test checkpoints.

The vLLM tests run vLLM in ``.venv-vllm`` (built by ``make test``; ``WITH_VLLM=0`` skips
them) as subprocesses, and compare with the reference engine in the test process."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"
needs_vllm = pytest.mark.skipif(not VLLM_PY.exists(), reason="no .venv-vllm (make test builds it unless WITH_VLLM=0)")
G1 = "SmolLM2-135M-Instruct-SwiftKV"
G2 = "SmolLM2-135M-Instruct-SwiftKV-AcrossKV2"


def zack_checkpoints(base_dir: Path, acrosskv_dir: Path, out: Path) -> dict[str, Path]:
    """ZACK on SwiftKV+AcrossKV at full rank with random rotations (must not change a token),
    and ZACK rank 32 of 64 on the base model (rotations from the weights' SVD)."""
    from swiftserve_vllm.reference import make_random_zack

    return {"zack_full": make_random_zack(acrosskv_dir, out / "zack-acrosskv2-r64", 64, seed=1, kind="random"),
            "zack_half": make_random_zack(base_dir, out / "zack-r32", 32, kind="weights")}
