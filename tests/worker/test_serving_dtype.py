"""worker.args.serving_dtype: ``--dtype auto`` on CPU becomes the measured CPU default
(swiftcommon.cpu_dtype), with SWIFTSERVE_CPU_DTYPE overriding it; explicit dtypes and CUDA pass."""

import pytest

from swiftcommon.cpu_dtype import auto_cpu_dtype
from worker.args import build_parser, check_args, config_from_args, serving_dtype


def test_the_worker_resolves_dtype_auto_on_cpu_by_the_rule(monkeypatch):
    monkeypatch.delenv("SWIFTSERVE_CPU_DTYPE", raising=False)     # tests/conftest.py pins float32
    want = auto_cpu_dtype()[0]
    dtype, note = serving_dtype("cpu", "auto")
    assert dtype == want and want in note and note.startswith("--dtype auto on CPU")
    assert serving_dtype("cpu", "float32") == ("float32", None)          # an explicit dtype is kept
    assert serving_dtype("cuda", "auto") == ("auto", None)               # CUDA: the engine's bf16
    monkeypatch.setenv("SWIFTSERVE_CPU_DTYPE", "float32")
    assert serving_dtype("cpu", "auto")[0] == "float32"


def test_the_worker_config_carries_the_choice_and_its_reason(monkeypatch):
    monkeypatch.setenv("SWIFTSERVE_CPU_DTYPE", "bfloat16")
    cfg = config_from_args(build_parser().parse_args(["--device", "cpu"]), model_dir="/m/SmolLM2")
    assert cfg.engine_config.dtype == "bfloat16" and "SWIFTSERVE_CPU_DTYPE=bfloat16" in cfg.dtype_note
    cfg = config_from_args(build_parser().parse_args(["--device", "cpu", "--dtype", "float32"]), model_dir="/m/SmolLM2")
    assert cfg.engine_config.dtype == "float32" and cfg.dtype_note is None


def test_a_bad_swiftserve_cpu_dtype_is_refused_with_its_name(monkeypatch, capsys):
    monkeypatch.setenv("SWIFTSERVE_CPU_DTYPE", "fp8")
    parser = build_parser()
    with pytest.raises(SystemExit) as exc:
        check_args(parser.parse_args([]), parser)
    assert exc.value.code == 2 and "SWIFTSERVE_CPU_DTYPE='fp8' not in ('float32', 'bfloat16')" in capsys.readouterr().err
