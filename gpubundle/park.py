"""Parking: the shipped checkpoint tensors (and large result files) leave the working tree for a
GPU session, and come back.

A lent GPU machine receives the working tree (tracked files and untracked, not ignored
ones, as they are on disk) with every command, within one carry limit. The tensors
under ``checkpoints/`` are most of that tree and the GPU session does not need them
there (``make gpu-pack`` carries the ones it uses), nor the large measurement records under
``results/``. ``park(root)`` moves every tracked file under ``SCOPES`` (``checkpoints/``,
``results/``) larger than ``THRESHOLD`` bytes into ``.gpu-park/`` at the
repository root (ignored by git and never carried, so it does not travel) under the same
relative path, and records each in ``.gpu-park/manifest.json`` with its size and sha256;
``unpark(root)`` verifies every parked file against that sha256 and moves it back.

- Both are idempotent: parking parked files or unparking restored ones does nothing.
- Neither overwrites: where both places hold a file, identical copies collapse into
  one (nothing is lost), different ones stop the command with both paths named.
- The manifest is written before any file moves; an interrupted command is finished by
  running it again. A manifest entry found in neither place is reported as lost.
- ``guard(root)``: the message ``make gpu-park-guard`` stops with while parked files are
  missing from the tree (``None`` when nothing is parked), for a script that needs the whole
  tree (a test run, a commit), so that they are not forgotten or committed away as deleted.

Moves are ``os.replace`` within one file system: modification times are kept, so the
shipped variants materialised from these files are not rebuilt. Standard library only; a parked
file keeps its path relative to the repository root under ``<root>/.gpu-park/``.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

PARK_DIR = ".gpu-park"
MANIFEST = "manifest.json"
SCOPE = "checkpoints"          # the shipped tensors (``plan.shipped_file`` finds them here or parked)
SCOPES = (SCOPE, "results")    # what parking takes files from
THRESHOLD = 1_000_000          # bytes: the tensors (3-17 MB) and the largest records; small JSON, logs, plots stay


def park_dir(root: str | Path) -> Path:
    return Path(root) / PARK_DIR


class ParkError(RuntimeError):
    """Parking or unparking cannot proceed safely; the message names the files."""


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks (also the pack's check; standard library only)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_manifest(root: str | Path) -> dict | None:
    path = park_dir(root) / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else None


def _write_manifest(root: Path, entries: dict[str, dict]) -> None:
    path = park_dir(root) / MANIFEST
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(MANIFEST + ".tmp")
    tmp.write_text(json.dumps({"scopes": list(SCOPES), "threshold": THRESHOLD, "files": entries}, indent=1) + "\n")
    tmp.replace(path)


def parkable(root: str | Path, scopes: tuple[str, ...] = SCOPES, threshold: int = THRESHOLD) -> list[str]:
    """Tracked files under ``scopes`` present in the tree and larger than ``threshold`` bytes (sorted)."""
    root = Path(root)
    out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--", *scopes], check=True,
                         capture_output=True).stdout.decode()
    names = [n for n in out.split("\0") if n]
    return sorted(n for n in names if (root / n).is_file() and not (root / n).is_symlink()
                  and (root / n).stat().st_size > threshold)


def parked_files(root: str | Path) -> list[str]:
    """Paths (relative to the root) of the files held in ``.gpu-park/``, the manifest excepted."""
    base = park_dir(root)
    if not base.is_dir():
        return []
    own = {base / MANIFEST, base / (MANIFEST + ".tmp")}
    return sorted(str(p.relative_to(base)) for p in base.rglob("*") if p.is_file() and p not in own)


def guard(root: str | Path) -> str | None:
    """Why the tree is incomplete because of parking, or None when nothing parked is missing from it."""
    root = Path(root)
    missing = [n for n in parked_files(root) if not (root / n).exists()]
    if not missing:
        return None
    size = sum((park_dir(root) / n).stat().st_size for n in missing)
    return (f"{len(missing)} file(s) ({size / (1 << 20):.1f} MiB) are parked in {PARK_DIR}/ by `make gpu-park` and "
            f"missing from the tree ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}): run "
            "`make gpu-unpark` first (it verifies their sha256 and moves them back)")


def _prune(base: Path) -> None:
    """Remove empty folders below ``base``, then ``base`` itself if empty."""
    for d in sorted((p for p in base.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        if not any(d.iterdir()):
            d.rmdir()
    if base.is_dir() and not any(base.iterdir()):
        base.rmdir()


def park(root: str | Path) -> dict:
    """Move the parkable files into ``.gpu-park/``; returns ``moved``, ``already`` (paths) and ``bytes`` parked."""
    root = Path(root).resolve()
    base = park_dir(root)
    entries = dict((read_manifest(root) or {}).get("files", {}))
    todo, conflicts = [], []
    for name in parkable(root):
        src, dst = root / name, base / name
        digest = sha256_file(src)
        if dst.exists() and not (dst.is_file() and sha256_file(dst) == digest):
            conflicts.append(f"{name} and {PARK_DIR}/{name} differ")
            continue
        entries[name] = {"size": src.stat().st_size, "sha256": digest}
        todo.append((name, None if dst.exists() else src))   # None: an identical parked copy; the tree's goes
    if conflicts:
        raise ParkError("refusing to overwrite: " + "; ".join(conflicts) +
                        " (keep one of each pair: move the other aside, then run again)")
    lost = [n for n in entries if not (root / n).exists() and not (base / n).exists()]
    if lost:
        raise ParkError(f"in the park manifest but in neither the tree nor {PARK_DIR}/: {', '.join(lost)} "
                        "(restore them with `git checkout -- <path>` if they were committed)")
    if todo:
        _write_manifest(root, entries)             # before any move: an interrupted park is finished by a rerun
    moved = []
    for name, src in todo:
        if src is None:
            (root / name).unlink()
        else:
            (base / name).parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, base / name)
        moved.append(name)
    already = sorted(n for n in entries if n not in moved and (base / n).is_file() and not (root / n).exists())
    return {"moved": moved, "already": already,
            "bytes": sum(entries[n]["size"] for n in entries if (base / n).is_file())}


def unpark(root: str | Path) -> dict:
    """Verify and move every parked file back; returns ``restored``, ``already`` (paths) and ``bytes``."""
    root = Path(root).resolve()
    base = park_dir(root)
    manifest = read_manifest(root)
    stray = [n for n in parked_files(root) if n not in (manifest or {}).get("files", {})]
    if stray:
        raise ParkError(f"{PARK_DIR}/ holds files its manifest does not list: {', '.join(stray)} "
                        "(move them back by hand, checking them with `git diff`)")
    if manifest is None:
        if base.is_dir():
            _prune(base)
        return {"restored": [], "already": [], "bytes": 0}
    todo, problems, already = [], [], []
    for name, entry in manifest["files"].items():
        src, dst = base / name, root / name
        if not src.exists():
            if dst.is_file():
                already.append(name)
            else:
                problems.append(f"{name}: in neither the tree nor {PARK_DIR}/")
            continue
        digest = sha256_file(src)
        if digest != entry["sha256"]:
            problems.append(f"{PARK_DIR}/{name} has sha256 {digest}, parked as {entry['sha256']}")
        elif dst.exists() and not (dst.is_file() and sha256_file(dst) == digest):
            problems.append(f"{name} exists and differs from {PARK_DIR}/{name} (refusing to overwrite)")
        else:
            todo.append((name, dst.exists()))
    if problems:
        raise ParkError("nothing moved: " + "; ".join(problems))
    restored, size = [], 0
    for name, identical_in_tree in todo:
        size += (base / name).stat().st_size
        if identical_in_tree:
            (base / name).unlink()
        else:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            os.replace(base / name, root / name)
        restored.append(name)
    (base / MANIFEST).unlink()
    _prune(base)
    return {"restored": restored, "already": sorted(already), "bytes": size}


def main(argv: list[str] | None = None) -> int:
    """``python -m gpubundle.park {park,unpark,status,guard} [--root DIR]``."""
    import argparse
    import sys

    p = argparse.ArgumentParser(prog="python -m gpubundle.park", description=__doc__.split("\n\n")[0])
    p.add_argument("cmd", choices=["park", "unpark", "status", "guard"])
    p.add_argument("--root", default=".", help="the repository (default: the current directory)")
    args = p.parse_args(argv)
    root = Path(args.root)
    mib = 1 << 20
    try:
        if args.cmd == "park":
            res = park(root)
            print(f"gpu-park: moved {len(res['moved'])} file(s) into {PARK_DIR}/ ({len(res['already'])} already "
                  f"there); {res['bytes'] / mib:.1f} MiB parked. Bring them back with `make gpu-unpark`.")
        elif args.cmd == "unpark":
            res = unpark(root)
            if not res["restored"] and not res["already"]:
                print("gpu-unpark: nothing parked")
            else:
                print(f"gpu-unpark: {len(res['restored'])} file(s) verified and moved back "
                      f"({res['bytes'] / mib:.1f} MiB), {len(res['already'])} already in place")
        elif args.cmd == "status":
            held = parked_files(root)
            print(f"{len(held)} file(s) parked in {PARK_DIR}/; {len(parkable(root))} parkable file(s) in "
                  f"{', '.join(s + '/' for s in SCOPES)}")
            for n in held:
                print(f"  {n}")
        else:
            why = guard(root)
            if why:
                print(f"error: {why}", file=sys.stderr)
                return 1
    except ParkError as exc:
        print(f"gpu-{args.cmd}: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
