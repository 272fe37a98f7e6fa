"""Shared fixtures. Tests that need the real model use ``smollm2_dir`` (prepared once;
``make test`` / CI prepares it before pytest runs, so here it is normally instant).
A preparation failure fails the test loudly: it is never a skip."""

import pytest


@pytest.fixture(scope="session")
def smollm2_dir():
    from modelkit.prepare import PrepareError, ensure_default_model

    try:
        return ensure_default_model()
    except PrepareError as exc:
        pytest.fail(f"cannot prepare SmolLM2-135M-Instruct (run `modelkit prepare`): {exc}", pytrace=False)
