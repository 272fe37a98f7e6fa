"""``refengine.omp_wait``: the engine process is spawned with a short OpenMP spin unless the user set theirs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from refengine.host_malloc import spawn_environment
from refengine.omp_wait import ENGINE_SPINCOUNT, spawn_overrides

CHILD = "import os; print(os.environ.get('GOMP_SPINCOUNT'), os.environ.get('OMP_WAIT_POLICY'))"


@pytest.fixture
def clean(monkeypatch):
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    return monkeypatch


def test_the_default_spin_and_the_users_own(clean):
    assert spawn_overrides() == {"GOMP_SPINCOUNT": str(ENGINE_SPINCOUNT)}
    clean.setenv("GOMP_SPINCOUNT", "50000")
    assert spawn_overrides() == {}
    clean.delenv("GOMP_SPINCOUNT")
    clean.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert spawn_overrides() == {}
    clean.setenv("OMP_WAIT_POLICY", "")              # empty: unset
    assert spawn_overrides() == {"GOMP_SPINCOUNT": str(ENGINE_SPINCOUNT)}


@pytest.mark.e2e
@pytest.mark.parametrize("huge", [False, True])
def test_a_process_spawned_inside_gets_it_and_later_ones_do_not(clean, huge):
    with spawn_environment(huge):
        inside = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True).stdout
    assert inside.split() == [str(ENGINE_SPINCOUNT), "None"]
    assert "GOMP_SPINCOUNT" not in os.environ                                   # restored for later children
    clean.setenv("GOMP_SPINCOUNT", "7")
    with spawn_environment(huge):
        inside = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True).stdout
    assert inside.split() == ["7", "None"] and os.environ["GOMP_SPINCOUNT"] == "7"
