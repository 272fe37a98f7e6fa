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


@pytest.fixture(scope="session")
def zack_dir(smollm2_dir, tmp_path_factory):
    """A servable ZACK SmolLM2 from ``modelkit zack-calibrate`` (1K tokens: mechanics, not quality)."""
    from modelkit.cli import main as modelkit_main

    out = tmp_path_factory.mktemp("zack") / "smol-zack"
    assert modelkit_main(["zack-calibrate", "--model", str(smollm2_dir), "--output", str(out), "--tokens", "1024",
                          "--seq-len", "128", "--batch", "8", "--rate", "0.5"]) == 0
    return out
