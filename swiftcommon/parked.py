"""Where ``make gpu-park`` keeps the shipped checkpoint tensors while they are out of the tree.

The parking itself (moving, the manifest, unparking) is ``swiftserve.gpusession.park``; this
module holds only the location, so that ``modelkit.shipped`` can name a parked file in its
error message without importing the CLI package. Contract: standard library only; a parked
file keeps its path relative to the repository root under ``<root>/.gpu-park/``.
"""

from __future__ import annotations

from pathlib import Path

PARK_DIR = ".gpu-park"


def park_dir(root: str | Path) -> Path:
    return Path(root) / PARK_DIR


def parked_copy(path: str | Path) -> Path | None:
    """The parked copy of a repository file missing from the tree (for error messages), or None."""
    path = Path(path).resolve()
    for root in path.parents:
        if (root / ".git").exists():
            copy = park_dir(root) / path.relative_to(root)
            return copy if copy.is_file() else None
    return None
