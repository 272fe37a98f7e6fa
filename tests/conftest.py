"""Shared fixtures. Tests that need the real model use ``smollm2_dir`` (prepared once;
``make test`` prepares it before pytest runs)."""

import pytest


@pytest.fixture(scope="session")
def smollm2_dir():
    from modelkit.prepare import ensure_default_model

    return ensure_default_model()
