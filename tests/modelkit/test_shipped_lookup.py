"""Where the shipped variants' files are looked up (no model): the repository's ``checkpoints/`` or
the folders of ``SWIFTSERVE_CHECKPOINTS``, and the error when a file is in none of them."""

import pytest

from modelkit import shipped
from modelkit.prepare import PrepareError


def test_shipped_files_come_from_swiftserve_checkpoints_or_are_named_missing(tmp_path, monkeypatch):
    rel = shipped.VARIANTS["SmolLM2-135M-Instruct-SwiftKV"][0]
    monkeypatch.setenv("SWIFTSERVE_CHECKPOINTS", str(tmp_path / "carried"))
    assert shipped.names() == [] and shipped.checkpoint_dirs() == [tmp_path / "carried"]
    (tmp_path / "carried" / rel).parent.mkdir(parents=True)
    (tmp_path / "carried" / rel).write_bytes(b"x")
    assert shipped.names() == ["SmolLM2-135M-Instruct-SwiftKV"] and shipped.find(rel) == tmp_path / "carried" / rel
    # A checkout whose tensors `make gpu-park` moved away gets the way back in the message.
    with pytest.raises(PrepareError, match=r"AcrossKV2: trained tensors .*g2\.safetensors is in none of: "
                                           r".*carried.*`make gpu-unpark` brings it back"):
        shipped.materialize("SmolLM2-135M-Instruct-SwiftKV-AcrossKV2")
