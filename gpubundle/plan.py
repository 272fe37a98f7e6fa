"""What a GPU pack takes from the working tree: the shipped SwiftKV tensors and the part size.

``SHIPPED`` names the tensors (relative to ``checkpoints/``) a SmolLM2 session uses;
``shipped_file`` finds one in the tree or, checked against the park manifest, in ``.gpu-park/``;
``plan_parts`` measures the tree that travels with every command and the part size it leaves
under the carry limit. Used by ``cli`` (``make gpu-pack``) and ``selftest`` alike; standard
library only, like ``park``.
"""

from __future__ import annotations

from pathlib import Path

from gpubundle import park
from gpubundle.limits import MIB, tree_bytes
from gpubundle.pack import PackError

# SwiftKV tensors the session uses when it carries SmolLM2 (relative to checkpoints/): l15-g1 is where
# its 50% distillation continues from, l15-g2 the AcrossKV checkpoint tests/gpu compares on CUDA.
SHIPPED = ["smollm2-swiftkv/swiftkv-l15-g1.safetensors", "smollm2-swiftkv/swiftkv-l15-g2.safetensors"]


def shipped_file(root: Path, rel: str) -> Path:
    """``checkpoints/rel`` from the tree, or its parked copy (checked against the park manifest)."""
    name = f"{park.SCOPE}/{rel}"
    if (root / name).is_file():
        return root / name
    copy = park.park_dir(root) / name
    entry = (park.read_manifest(root) or {}).get("files", {}).get(name)
    if not copy.is_file() or entry is None:
        raise PackError(f"{name} is neither in the tree nor parked in {park.PARK_DIR}/")
    if park.sha256_file(copy) != entry["sha256"]:
        raise PackError(f"{park.PARK_DIR}/{name} does not match the sha256 it was parked with")
    return copy


def shipped_pack_name(rel: str) -> str:
    return "shipped." + rel.replace("/", "~")


def plan_parts(root: Path, carry_mib: float, margin_mib: float, part_mib: float | None = None) -> dict:
    """The tree that travels with every command now, the parking state, and the part size it leaves."""
    tree = tree_bytes(root)
    loose = park.parkable(root)
    part = int(part_mib * MIB) if part_mib else int(carry_mib * MIB) - tree - int(margin_mib * MIB)
    return {"tree_bytes": tree, "parked": park.parked_files(root), "parkable": loose,
            "parkable_bytes": sum((root / n).stat().st_size for n in loose), "part_bytes": part}
