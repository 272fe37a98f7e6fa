"""refengine.triton_decode: the CUDA paged decode kernel, run here in Triton's interpreter on CPU.

Each case runs in its own process (``triton_cases.py``: TRITON_INTERPRET must be set before triton is
imported). The kernel against a float32 gather-and-softmax reference (GQA groups, ragged K/V widths
as ZACK makes them, windows, one-entry sequences, float32 and bf16 pools); the engine's self-check
and its refusal of a kernel that disagrees; and inside the engine on the real SmolLM2: decode
attention by the interpreted kernel, through the static padded step that a CUDA graph replays
(refengine.graph_decode), against the C++ kernel's ordinary steps."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e            # each case starts a process (tests/tier_support.py)

pytest.importorskip("triton", reason="triton is in the dev extra (make install); the kernel's tests need it")

CASES = Path(__file__).with_name("triton_cases.py")
ROOT = Path(__file__).resolve().parents[2]


def run_case(*args: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run([sys.executable, str(CASES), *args], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-4000:]


def test_kernel_equals_the_reference():
    run_case("kernel")


def test_self_check_passes_here_and_names_a_failure():
    run_case("self_check")


def test_engine_decodes_through_the_kernel_in_the_static_step(smollm2_dir):
    run_case("engine", str(smollm2_dir))
