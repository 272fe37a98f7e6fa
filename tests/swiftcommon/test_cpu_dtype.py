"""swiftcommon.cpu_dtype: the serving default dtype on CPU (native bf16 -> bfloat16, else float32)
and the SWIFTSERVE_CPU_DTYPE override (the worker's use of it: tests/worker/test_serving_dtype.py)."""

import pytest

from swiftcommon.cpu_dtype import auto_cpu_dtype, cpu_flags


def test_native_bf16_flags_pick_bfloat16_and_emulated_bf16_keeps_float32():
    assert auto_cpu_dtype({"avx2", "fma", "avx512f", "avx512_bf16"})[0] == "bfloat16"
    assert auto_cpu_dtype({"avx2", "amx_bf16", "amx_tile"})[0] == "bfloat16"
    dtype, why = auto_cpu_dtype({"avx2", "fma", "avx512f"})
    assert dtype == "float32" and "emulated" in why
    assert auto_cpu_dtype(set())[0] == "float32"


def test_the_override_wins_and_a_bad_one_is_refused():
    assert auto_cpu_dtype({"avx512_bf16"}, override="float32") == ("float32", "SWIFTSERVE_CPU_DTYPE=float32")
    assert auto_cpu_dtype(set(), override="bfloat16")[0] == "bfloat16"
    with pytest.raises(ValueError, match="SWIFTSERVE_CPU_DTYPE"):
        auto_cpu_dtype(set(), override="fp8")


def test_cpu_flags_reads_proc_cpuinfo(tmp_path):
    f = tmp_path / "cpuinfo"
    f.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512_bf16\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    assert cpu_flags(f) == {"fpu", "avx2", "avx512_bf16"}
    assert cpu_flags(tmp_path / "missing") == set()
