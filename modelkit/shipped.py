"""Distilled checkpoints that ship with the repository as trained tensors only.

A shipped variant is the prepared base model plus a small safetensors file of
SwiftKV tensors in ``checkpoints/``; ``materialize(name)`` writes the full
SwiftKV checkpoint into the cache once (base weights hard-linked) and returns it.
"""

from __future__ import annotations

from pathlib import Path

CHECKPOINTS = Path(__file__).resolve().parent.parent / "checkpoints"

# name -> (tensor file relative to checkpoints/, l, g)
VARIANTS: dict[str, tuple[str, int, int]] = {
    "SmolLM2-135M-Instruct-SwiftKV": ("smollm2-swiftkv/swiftkv-l15-g1.safetensors", 15, 1),
    "SmolLM2-135M-Instruct-SwiftKV-AcrossKV2": ("smollm2-swiftkv/swiftkv-l15-g2.safetensors", 15, 2),
}


def names() -> list[str]:
    return [n for n, (f, _, _) in VARIANTS.items() if (CHECKPOINTS / f).is_file()]


def is_shipped(name: str) -> bool:
    return any(name.lower() == n.lower() for n in VARIANTS)


def materialize(name: str) -> Path:
    from safetensors.torch import load_file

    from modelkit.prepare import PrepareError, _lock, default_model_dir, ensure_default_model
    from modelkit.swiftkv import write_swiftkv_checkpoint
    from swiftserve import envs

    key = next(n for n in VARIANTS if n.lower() == name.lower())
    rel, l, g = VARIANTS[key]
    tensors_path = CHECKPOINTS / rel
    if not tensors_path.is_file():
        raise PrepareError(f"{key}: trained tensors {tensors_path} are not in this checkout")
    base = ensure_default_model()
    out = default_model_dir().parent / key
    stamp = out / ".source-mtime"
    with _lock(envs.cache_dir() / "locks" / f"{key}.lock"):
        if stamp.is_file() and stamp.read_text() == str(tensors_path.stat().st_mtime_ns):
            return out
        write_swiftkv_checkpoint(base, out, l, g, load_file(str(tensors_path)))
        stamp.write_text(str(tensors_path.stat().st_mtime_ns))
    return out
