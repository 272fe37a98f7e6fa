"""The serving default dtype on CPU (``--dtype auto`` of the worker, both engines), by measurement.

Contract: ``auto_cpu_dtype(flags, override) -> (dtype, reason)`` with dtype "bfloat16" or
"float32". ``override`` (SWIFTSERVE_CPU_DTYPE, read by swiftcommon.envs and passed in) wins
when it is one of the two; otherwise bfloat16 where the CPU has native bf16 arithmetic
(AVX-512-BF16 or AMX-BF16 in ``flags``, /proc/cpuinfo's when None), float32 elsewhere. No torch.

Why (results/perf/README.md, "Default dtype"): on a 2-core AVX-512-BF16 CPU both engines are
fastest in bf16 (oneDNN's bf16 GEMMs run at ~90% of a bf16 dot-product peak twice the float32
FMA peak; our bf16 prefill attention uses the same instruction), and bf16 through the cache
is within the stated quality bound of float32 (SmolLM2: perplexity +-0.15%, teacher-forced top-1
agreement 97.6%; results/perf/dtype/). Where bf16 is emulated (AVX2 machines) it is slower
than float32, so float32 stays the default there.
"""

from __future__ import annotations

from pathlib import Path

NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
CHOICES = ("float32", "bfloat16")


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The feature flags of the first CPU in /proc/cpuinfo (empty where it cannot be read)."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def auto_cpu_dtype(flags: set[str] | None = None, override: str | None = None) -> tuple[str, str]:
    if override is not None:
        if override not in CHOICES:
            raise ValueError(f"SWIFTSERVE_CPU_DTYPE={override!r} not in {CHOICES}")
        return override, f"SWIFTSERVE_CPU_DTYPE={override}"
    have = sorted(set(NATIVE_BF16_FLAGS) & (cpu_flags() if flags is None else flags))
    if have:
        return "bfloat16", f"this CPU has native bf16 ({', '.join(have)})"
    return "float32", "this CPU has no native bf16 (no avx512_bf16 / amx_bf16): bf16 would be emulated"
