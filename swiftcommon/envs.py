"""The one module that reads environment variables.

Every other module receives values through its process's config object, built at
the entry point from CLI flags whose defaults come from here. Keep this list the
complete inventory of environment variables the project understands (README's
table is generated from the same names).
"""

from __future__ import annotations

import os
from pathlib import Path


def _get(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return value if value not in (None, "") else default


def cache_dir() -> Path:
    """Where prepared models and downloads live (SWIFTSERVE_CACHE, else ~/.cache/swiftserve)."""
    default = Path(_get("XDG_CACHE_HOME", str(Path.home() / ".cache"))) / "swiftserve"
    return Path(_get("SWIFTSERVE_CACHE", str(default))).expanduser()


def checkpoint_dirs() -> list[Path] | None:
    """Where the shipped variants' files are looked up, in order (SWIFTSERVE_CHECKPOINTS, folders
    separated like PATH); None = the repository's ``checkpoints/`` only (modelkit.shipped)."""
    raw = _get("SWIFTSERVE_CHECKPOINTS")
    return [Path(d).expanduser() for d in raw.split(os.pathsep) if d] if raw else None


def log_level() -> str:
    return (_get("SWIFTSERVE_LOG_LEVEL", "info") or "info").lower()


def api_keys() -> list[str]:
    """Comma-separated bearer keys accepted by the gateway (SWIFTSERVE_API_KEYS); empty = no auth."""
    raw = _get("SWIFTSERVE_API_KEYS", "") or ""
    return [k.strip() for k in raw.split(",") if k.strip()]


def worker_urls() -> list[str]:
    """Comma-separated worker base URLs for the gateway (SWIFTSERVE_WORKERS)."""
    raw = _get("SWIFTSERVE_WORKERS", "") or ""
    return [u.strip().rstrip("/") for u in raw.split(",") if u.strip()]


def is_ci() -> bool:
    return (_get("CI", "") or "").lower() in ("1", "true", "yes")


def torch_threads() -> int | None:
    """Intra-op threads for the reference engine (SWIFTSERVE_TORCH_THREADS); None = torch default."""
    raw = _get("SWIFTSERVE_TORCH_THREADS")
    return int(raw) if raw else None


def vllm_cpu_threads_bind() -> str | None:
    """vLLM-CPU's OpenMP core binding (VLLM_CPU_OMP_THREADS_BIND) when the user set it; None = ours."""
    return _get("VLLM_CPU_OMP_THREADS_BIND")


def vllm_cpu_kvcache_space() -> str | None:
    """vLLM-CPU's KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE) when the user set it; None = ours."""
    return _get("VLLM_CPU_KVCACHE_SPACE")



def glibc_tunables() -> str | None:
    """The C library's own settings (GLIBC_TUNABLES), kept when the worker adds its huge-page one
    for the engine process (refengine/host_malloc.py)."""
    return _get("GLIBC_TUNABLES")


def cpu_dtype() -> str | None:
    """The dtype the worker's ``--dtype auto`` picks on CPU (SWIFTSERVE_CPU_DTYPE: float32 | bfloat16);
    None = the measured rule of swiftcommon.cpu_dtype (bfloat16 where the CPU has native bf16)."""
    return _get("SWIFTSERVE_CPU_DTYPE")


def engine_core() -> str | None:
    """Default of the worker's --engine-core (SWIFTSERVE_ENGINE_CORE: process | thread); None = process."""
    return _get("SWIFTSERVE_ENGINE_CORE")
