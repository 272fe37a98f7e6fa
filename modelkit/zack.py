"""A servable ZACK model directory from a base model and its calibration (``write_zack_model``).

The output directory already holds the calibration (``zack.json``: record + singular values;
``zack.safetensors``: rotations, see ``refengine.kv.methods.zack.format``); this makes it a model
directory too: the base model's weights hard-linked (or copied), its tokenizer files, a weight
index that leaves the rotations out, and ``config.json`` with a ``"zack"`` object holding
per-head ranks for the rate and mode. Takes directories, never model names (``modelkit.models``
resolves names above this module); the command is ``zack_cli``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from modelkit.swiftkv import SIDE_FILES, _link_or_copy
from refengine.kv.methods.zack.format import CALIBRATION_FILE, ROTATIONS_FILE


def _weight_map(base_dir: Path) -> dict[str, str]:
    index = base_dir / "model.safetensors.index.json"
    if index.is_file():
        return dict(json.loads(index.read_text())["weight_map"])
    from safetensors import safe_open

    out = {}
    for f in sorted(base_dir.glob("*.safetensors")):
        if f.name == ROTATIONS_FILE:
            continue
        with safe_open(str(f), framework="pt") as h:
            out.update({name: f.name for name in h.keys()})
    return out


def write_zack_model(base_dir: Path, out_dir: Path, rate: float, mode: str = "adaptive", rank_multiple: int = 1,
                     swiftkv: bool = True) -> dict:
    """Make ``out_dir`` (which already holds zack.json + zack.safetensors) a servable model; returns its zack config."""
    from refengine.kv.base import MethodError
    from refengine.kv.methods.zack.method import ZackMethod
    from refengine.kv.registry import facts_for

    base_dir, out_dir = Path(base_dir), Path(out_dir)
    facts = facts_for(base_dir, swiftkv)
    method = ZackMethod({"rate": rate, "mode": mode, "rank_multiple": rank_multiple, "calibration": str(out_dir)})
    reasons = method.validate(facts)
    if reasons:
        raise MethodError("; ".join(reasons))
    weight_map = _weight_map(base_dir)
    for fname in sorted(set(weight_map.values())):
        _link_or_copy(base_dir / fname, out_dir / fname)
    total = sum((out_dir / f).stat().st_size for f in set(weight_map.values()))
    (out_dir / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    for f in SIDE_FILES:
        if (base_dir / f).is_file():
            shutil.copy2(base_dir / f, out_dir / f)
    cfg = json.loads((base_dir / "config.json").read_text())
    cfg["zack"] = method.served_config(facts)
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2))
    return cfg["zack"]
