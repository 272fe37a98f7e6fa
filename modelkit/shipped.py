"""Variants that ship with the repository as small files on top of the prepared base model.

- SwiftKV: a safetensors file of distilled SwiftKV tensors (``VARIANTS``).
- ZACK: a calibration (``zack.json`` + ``zack.safetensors``) of the base or of a shipped
  SwiftKV variant, served at a chosen rate and rank mode (``ZACK_VARIANTS``).
``materialize(name)`` writes the servable directory into the cache once (base weights
hard-linked) and returns it; a change of the shipped files or settings rewrites it.
The files are looked up in ``checkpoint_dirs()``: the repository's ``checkpoints/``, or the
folders of ``SWIFTSERVE_CHECKPOINTS`` (a GPU session adds the ones its pack carried there).
"""

from __future__ import annotations

from pathlib import Path

CHECKPOINTS = Path(__file__).resolve().parent.parent / "checkpoints"

# name -> (tensor file relative to checkpoints/, l, g)
VARIANTS: dict[str, tuple[str, int, int]] = {
    "SmolLM2-135M-Instruct-SwiftKV": ("smollm2-swiftkv/swiftkv-l15-g1.safetensors", 15, 1),
    "SmolLM2-135M-Instruct-SwiftKV-AcrossKV2": ("smollm2-swiftkv/swiftkv-l15-g2.safetensors", 15, 2),
    # quality first: prefill skips 8 of 30 layers (l=22) instead of 15
    "SmolLM2-135M-Instruct-SwiftKV-25pct": ("smollm2-swiftkv/swiftkv-l22-g1.safetensors", 22, 1),
    # closest to the original: prefill skips 4 of 30 layers (l=26)
    "SmolLM2-135M-Instruct-SwiftKV-13pct": ("smollm2-swiftkv/swiftkv-l26-g1.safetensors", 26, 1),
    # prefill skips 3 of 30 layers (l=27)
    "SmolLM2-135M-Instruct-SwiftKV-10pct": ("smollm2-swiftkv/swiftkv-l27-g1.safetensors", 27, 1),
}


# name -> (calibration directory relative to checkpoints/, base: "default" or a VARIANTS name, rate, mode)
# The rate is the highest swept adaptive rate keeping >= 99% of the baseline's quality (results/zack/).
ZACK_VARIANTS: dict[str, tuple[str, str, float, str]] = {
    "SmolLM2-135M-Instruct-ZACK": ("smollm2-zack", "default", 0.01, "adaptive"),
    "SmolLM2-135M-Instruct-SwiftKV-ZACK": ("smollm2-swiftkv-zack", "SmolLM2-135M-Instruct-SwiftKV", 0.01, "adaptive"),
}


def checkpoint_dirs() -> list[Path]:
    from swiftcommon import envs

    return envs.checkpoint_dirs() or [CHECKPOINTS]


def find(rel: str) -> Path | None:
    """The first ``<dir>/rel`` of ``checkpoint_dirs()`` that is a file, or None."""
    return next((d / rel for d in checkpoint_dirs() if (d / rel).is_file()), None)


def _absent(key: str, what: str, rel: str) -> str:
    """The error for a shipped file found nowhere (with a hint for a checkout whose tensors are parked)."""
    dirs = ", ".join(map(str, checkpoint_dirs()))
    return (f"{key}: {what} {rel} is in none of: {dirs} (if `make gpu-park` moved it out of the tree, "
            "`make gpu-unpark` brings it back)")


def names() -> list[str]:
    return ([n for n, (f, _, _) in VARIANTS.items() if find(f)]
            + [n for n, (d, _, _, _) in ZACK_VARIANTS.items() if find(f"{d}/zack.json")])


def is_shipped(name: str) -> bool:
    return any(name.lower() == n.lower() for n in (*VARIANTS, *ZACK_VARIANTS))


def _materialize_zack(key: str) -> Path:
    import shutil

    from modelkit.prepare import PrepareError, _lock, default_model_dir, ensure_default_model
    from modelkit.zack import write_zack_model
    from refengine.kv.methods.zack.format import CALIBRATION_FILE, ROTATIONS_FILE
    from swiftcommon import envs

    rel, base_name, rate, mode = ZACK_VARIANTS[key]
    found = find(f"{rel}/{CALIBRATION_FILE}")
    files = [found.parent / CALIBRATION_FILE, found.parent / ROTATIONS_FILE] if found else []
    if not found or not files[1].is_file():
        missing = f"{rel}/{ROTATIONS_FILE if found else CALIBRATION_FILE}"
        raise PrepareError(_absent(key, "ZACK calibration file", missing))
    base = ensure_default_model() if base_name == "default" else materialize(base_name)
    out = default_model_dir().parent / key
    stamp = out / ".source-mtime"
    source = f"{[f.stat().st_mtime_ns for f in files]} {base_name} {rate} {mode} {base.stat().st_mtime_ns}"
    with _lock(envs.cache_dir() / "locks" / f"{key}.lock"):
        if stamp.is_file() and stamp.read_text() == source:
            return out
        out.mkdir(parents=True, exist_ok=True)
        for f in files:
            shutil.copy2(f, out / f.name)
        write_zack_model(base, out, rate, mode)
        stamp.write_text(source)
    return out


def materialize(name: str) -> Path:
    from safetensors.torch import load_file

    from modelkit.prepare import PrepareError, _lock, default_model_dir, ensure_default_model
    from modelkit.swiftkv import write_swiftkv_checkpoint
    from swiftcommon import envs

    key = next(n for n in (*VARIANTS, *ZACK_VARIANTS) if n.lower() == name.lower())
    if key in ZACK_VARIANTS:
        return _materialize_zack(key)
    rel, l, g = VARIANTS[key]
    tensors_path = find(rel)
    if tensors_path is None:
        raise PrepareError(_absent(key, "trained tensors", rel))
    base = ensure_default_model()
    out = default_model_dir().parent / key
    stamp = out / ".source-mtime"
    # the base's GGUF (if any) is linked in too: its presence is part of the stamp
    source = f"{tensors_path.stat().st_mtime_ns} gguf={sorted(f.name for f in base.glob('*.gguf'))}"
    with _lock(envs.cache_dir() / "locks" / f"{key}.lock"):
        if stamp.is_file() and stamp.read_text() == source:
            return out
        write_swiftkv_checkpoint(base, out, l, g, load_file(str(tensors_path)))
        stamp.write_text(source)
    return out
