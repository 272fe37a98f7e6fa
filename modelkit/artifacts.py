"""Safe on-disk artifacts for the model toolkit: hashing, locking, atomic directories, manifests.

Contract:
- ``sha256_file(path, progress)`` streams a file through sha256 (tqdm bar when ``progress``).
- ``file_lock(path)`` is an exclusive ``fcntl.flock`` held for the ``with`` block; it serialises
  processes on one machine (two workers starting at once), not threads of one process.
- ``check_writable(dir)`` / ``check_free_space(dir, bytes)`` fail early with ``ArtifactError`` and a
  message meant for the user; ``describe_os_error`` turns an ``OSError`` (ENOSPC, EACCES, EROFS,
  ...) into such a message.
- ``install_dir(built, dest)`` moves a fully written directory into place: a reader sees either the
  old directory or the new one, never a half-written one (the only gap is between two renames).
- A manifest (``MANIFEST`` inside the directory) lists the size and sha256 of every other file;
  ``check_manifest`` compares sizes (cheap) or hashes (``verify=True``) and says what is wrong.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

MANIFEST = "swiftserve-manifest.json"


class ArtifactError(RuntimeError):
    """A failure with a one-line message meant for the user (the CLI prints it, no traceback)."""


def sha256_file(path: Path, progress: bool = False) -> str:
    from tqdm import tqdm

    h = hashlib.sha256()
    with open(path, "rb") as f, tqdm(total=path.stat().st_size, unit="B", unit_scale=True, disable=not progress,
                                     desc=f"sha256 {path.name}", leave=False) as bar:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
            bar.update(len(chunk))
    return h.hexdigest()


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # "a" never truncates, so a lock file that another user can only append to still works.
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def describe_os_error(exc: OSError, where: Path) -> str:
    if exc.errno == errno.ENOSPC:
        return f"disk full while writing under {where}: free some space or use another --cache-dir/--output"
    if exc.errno in (errno.EEXIST, errno.ENOTDIR):   # mkdir through a regular file
        return (f"{where} is not writable: {exc.filename or where} is in the way and is not a directory; "
                "use --output or --cache-dir (or SWIFTSERVE_CACHE) to write elsewhere")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return (f"{where} is not writable ({exc.strerror}: {exc.filename or where}); "
                "use --output or --cache-dir (or SWIFTSERVE_CACHE) to write elsewhere")
    return f"cannot write under {where}: {exc.strerror or exc} ({exc.filename or where})"


def check_writable(directory: Path) -> None:
    """Create ``directory`` if needed and prove we can create and remove a file in it."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-probe-", dir=directory)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ArtifactError(describe_os_error(exc, directory)) from exc


def check_free_space(directory: Path, needed: int) -> None:
    free = shutil.disk_usage(directory).free
    if free < needed:
        raise ArtifactError(f"not enough free disk space in {directory}: {free / 1e9:.2f} GB free, "
                            f"{needed / 1e9:.2f} GB needed; free some space or use another --cache-dir/--output")


def install_dir(built: Path, dest: Path) -> None:
    """Replace ``dest`` by ``built`` (same file system). The old directory is renamed aside first,
    so a crash leaves either the old or the new directory under ``dest``'s name plus litter."""
    if dest.exists():
        aside = dest.parent / f".old-{dest.name}-{os.getpid()}"
        shutil.rmtree(aside, ignore_errors=True)
        os.rename(dest, aside)
        os.rename(built, dest)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.rename(built, dest)


def write_manifest(directory: Path, meta: dict[str, Any], progress: bool = False) -> dict[str, Any]:
    files = {p.name: {"size": p.stat().st_size, "sha256": sha256_file(p, progress)}
             for p in sorted(directory.iterdir()) if p.is_file() and p.name != MANIFEST}
    manifest = {**meta, "files": files}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def read_manifest(directory: Path) -> dict[str, Any] | None:
    try:
        return json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def check_manifest(directory: Path, expect: dict[str, Any], verify: bool = False,
                   progress: bool = False) -> str | None:
    """None when ``directory`` matches its manifest (and the manifest has the ``expect`` entries);
    otherwise a short reason."""
    manifest = read_manifest(directory)
    if manifest is None:
        return "no manifest"
    for key, value in expect.items():
        if manifest.get(key) != value:
            return f"manifest {key} is {manifest.get(key)!r}, expected {value!r}"
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        return "manifest lists no files"
    for name, meta in files.items():
        f = directory / name
        try:
            if f.stat().st_size != meta["size"]:
                return f"{name}: size differs from the manifest"
            if verify and sha256_file(f, progress) != meta["sha256"]:
                return f"{name}: sha256 differs from the manifest"
        except (OSError, KeyError, TypeError):
            return f"{name}: missing or unreadable"
    return None
