"""Size limits of a GPU session: what may travel to the GPU machine and what may come back.

A lent GPU machine receives a copy of the repository's working tree plus named ignored
folders (the carry), all together at most ``carry_mib`` per command, and returns at most
``out_files`` files of at most ``out_file_mib`` each (``out_total_mib`` together) from one
output folder. The defaults are those of the machines this project is tested on; every
entry point takes them as options. No torch here.

- ``tree_bytes(root)``: the bytes that travel with every command: files git tracks, untracked
  files it does not ignore, and a ``shared/`` folder if the checkout has one.
- ``tree_files(root)``: those files (tracked ones missing from the disk, e.g. parked, do not travel).
- ``largest_tree_files(root, n)``: where those bytes are (for the message when a pack cannot fit).
- ``out_problems(folder, limits)``: why a folder could not come back whole ([] = it can).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

MIB = 1 << 20


@dataclass(frozen=True)
class Limits:
    carry_mib: float = 64.0          # working tree + carried folders, per command
    out_files: int = 8               # files brought back from the output folder
    out_file_mib: float = 16.0       # per file
    out_total_mib: float = 64.0      # all files together
    out_depth: int = 2               # folders below the output folder (files at depth <= this come back)


def tree_files(root: str | Path) -> list[Path]:
    root = Path(root)

    def git(*args: str) -> list[str]:
        out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", *args], check=True,
                             capture_output=True).stdout.decode()
        return [p for p in out.split("\0") if p]

    names = set(git()) | set(git("--others", "--exclude-standard"))
    files = [root / n for n in names]
    shared = root / "shared"
    if shared.is_dir():
        files += [p for p in shared.rglob("*") if p.is_file()]
    return [f for f in files if f.is_file() and not f.is_symlink()]


def tree_bytes(root: str | Path) -> int:
    return sum(f.stat().st_size for f in tree_files(Path(root)))


def largest_tree_files(root: str | Path, n: int = 5) -> list[tuple[str, int]]:
    root = Path(root)
    sizes = sorted(((str(f.relative_to(root)), f.stat().st_size) for f in tree_files(root)), key=lambda x: -x[1])
    return sizes[:n]


def out_problems(folder: str | Path, limits: Limits = Limits()) -> list[str]:
    folder = Path(folder)
    files = [p for p in folder.rglob("*") if p.is_file()]
    problems = []
    if len(files) > limits.out_files:
        problems.append(f"{len(files)} files in {folder}; at most {limits.out_files} come back")
    total = 0
    for f in files:
        size = f.stat().st_size
        total += size
        if size > limits.out_file_mib * MIB:
            problems.append(f"{f.name} is {size / MIB:.1f} MiB; at most {limits.out_file_mib:g} MiB per file")
        if len(f.relative_to(folder).parts) - 1 > limits.out_depth:
            problems.append(f"{f.relative_to(folder)} is more than {limits.out_depth} folders deep")
    if total > limits.out_total_mib * MIB:
        problems.append(f"{total / MIB:.1f} MiB in all; at most {limits.out_total_mib:g} MiB")
    return problems
