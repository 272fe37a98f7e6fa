"""Fixtures for the KV-method tests: a SwiftKV (AcrossKV g=2) checkpoint of SmolLM2 and quick
ZACK calibrations of it and of SmolLM2 (few tokens: enough for mechanics, not for quality)."""

import json

import pytest


@pytest.fixture(scope="session")
def acrosskv_dir(smollm2_dir, tmp_path_factory):
    from modelkit.swiftkv import write_swiftkv_checkpoint

    return write_swiftkv_checkpoint(smollm2_dir, tmp_path_factory.mktemp("kv") / "swiftkv-l15-g2", 15, 2)


def calibrate_into(model_dir, out, basis="whitened"):
    from safetensors.torch import save_file

    from modelkit.zack_calibrate import calibrate
    from refengine.kv.methods.zack.format import CALIBRATION_FILE, ROTATIONS_FILE

    record, tensors = calibrate(model_dir, tokens=1024, seq_len=128, batch=8, basis=basis, progress=False)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / ROTATIONS_FILE))
    (out / CALIBRATION_FILE).write_text(json.dumps(record))
    return out


@pytest.fixture(scope="session")
def zack_calibrations(smollm2_dir, acrosskv_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("zack")
    # the paper's stacked basis on one layout, the whitened basis on the other: both stay exact at rate 0
    return {"base": calibrate_into(smollm2_dir, root / "base", basis="stacked"),
            "swiftkv": calibrate_into(acrosskv_dir, root / "swiftkv")}
