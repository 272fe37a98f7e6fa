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


def vllm_use_aot_compile() -> str | None:
    """vLLM's AOT compile artifacts (VLLM_USE_AOT_COMPILE) when the user set it; None = ours (off on vllm-cpu)."""
    return _get("VLLM_USE_AOT_COMPILE")


def vllm_cpu_kvcache_space() -> str | None:
    """vLLM-CPU's KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE) when the user set it; None = ours."""
    return _get("VLLM_CPU_KVCACHE_SPACE")



def glibc_tunables() -> str | None:
    """The C library's own settings (GLIBC_TUNABLES), kept when the worker adds its huge-page one
    for the engine process (refengine/host_malloc.py)."""
    return _get("GLIBC_TUNABLES")


def gomp_spincount() -> str | None:
    """The user's own GOMP_SPINCOUNT (libgomp's spin before a waiting thread sleeps), kept for the
    engine process instead of refengine/omp_wait.py's."""
    return _get("GOMP_SPINCOUNT")


def decode_stack_enabled() -> bool:
    """SWIFTSERVE_DECODE_STACK=0 runs a pure-decode step's layers as Python modules instead of
    refengine/decode_stack.py's one C++ call (the same results; for A/B measurements)."""
    return _get("SWIFTSERVE_DECODE_STACK") not in ("0", "false", "off")


def omp_wait_policy() -> str | None:
    """The user's own OMP_WAIT_POLICY (ACTIVE / PASSIVE): refengine/omp_wait.py then sets no spin count."""
    return _get("OMP_WAIT_POLICY")


def cpu_dtype() -> str | None:
    """The dtype the worker's ``--dtype auto`` picks on CPU (SWIFTSERVE_CPU_DTYPE: float32 | bfloat16);
    None = the measured rule of swiftcommon.cpu_dtype (bfloat16 where the CPU has native bf16)."""
    return _get("SWIFTSERVE_CPU_DTYPE")


def engine_core() -> str | None:
    """Default of the worker's --engine-core (SWIFTSERVE_ENGINE_CORE: process | thread); None = process."""
    return _get("SWIFTSERVE_ENGINE_CORE")


# Request and connection limits (docs/reliability.md, "Limits"): each variable is the default of the
# flag of the same name (SWIFTSERVE_MAX_TOOLS -> --max-tools); the flag wins.
LIMIT_VARIABLES = (
    "SWIFTSERVE_MAX_PROMPT_BYTES",       # worker: prompt text bytes before tokenisation (0: from the context)
    "SWIFTSERVE_MAX_STOP_STRINGS",       # worker: stop strings per request
    "SWIFTSERVE_MAX_TOOLS",              # worker: tools per request
    "SWIFTSERVE_MAX_CONSTRAINT_BYTES",   # worker: one constraint (schema, regex, grammar, choices, tools' schemas)
    "SWIFTSERVE_CONSTRAINT_TIMEOUT",     # worker: seconds to compile a constraint at the edge
    "SWIFTSERVE_SCREEN_BODY_BYTES",      # worker: bodies this large are checked in a child process first (0: never)
    "SWIFTSERVE_ENGINE_STEP_TIMEOUT",    # worker: seconds without engine progress = a hung engine
    "SWIFTSERVE_MAX_HEADER_BYTES",       # gateway: request line + headers
    "SWIFTSERVE_MAX_HEADERS",            # gateway: header lines per request
    "SWIFTSERVE_HEADER_TIMEOUT",         # gateway: seconds to receive a request's headers
)


def limit(name: str, default: float):
    """The value of limit variable ``name`` (one of ``LIMIT_VARIABLES``) as the type of ``default``, or
    ``default`` when unset. A value that is not a number raises ValueError naming the variable."""
    if name not in LIMIT_VARIABLES:
        raise KeyError(f"{name} is not a limit variable")
    raw = _get(name)
    if raw is None:
        return default
    try:
        return type(default)(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a {type(default).__name__}") from None
