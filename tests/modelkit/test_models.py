"""modelkit.models.resolve_model: names and directories (the prepared default model: test_prepare.py)."""

from __future__ import annotations

import pytest

from modelkit.models import resolve_model
from modelkit.prepare import PrepareError


def test_resolve_model_rejects_unknown_names_and_bare_directories(tmp_path):
    with pytest.raises(PrepareError, match="neither a known name"):
        resolve_model(str(tmp_path / "missing"))
    with pytest.raises(PrepareError, match="no config.json"):
        resolve_model(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model(str(tmp_path)) == tmp_path
