"""Reading (and writing) HF safetensors checkpoints, single-file or sharded.

``WeightSource`` gives lazy access by tensor name so that the model only loads
what it uses (e.g. SwiftKV later layers never load their original k/v_proj).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open


class WeightSource:
    def __init__(self, model_dir: str | Path) -> None:
        model_dir = Path(model_dir)
        index = model_dir / "model.safetensors.index.json"
        self._where: dict[str, Path] = {}
        if index.is_file():
            for name, fname in json.loads(index.read_text())["weight_map"].items():
                self._where[name] = model_dir / fname
        else:
            files = sorted(model_dir.glob("*.safetensors"))
            if not files:
                raise FileNotFoundError(f"no *.safetensors in {model_dir}")
            for f in files:
                with safe_open(str(f), framework="pt") as h:
                    for name in h.keys():
                        self._where[name] = f
        self._handles: dict[Path, object] = {}

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def names(self) -> list[str]:
        return list(self._where)

    def get(self, name: str, dtype: torch.dtype | None = None, device: torch.device | str = "cpu") -> torch.Tensor:
        if name not in self._where:
            raise KeyError(f"checkpoint has no tensor {name!r}")
        path = self._where[name]
        h = self._handles.get(path)
        if h is None:
            h = self._handles[path] = safe_open(str(path), framework="pt")
        t = h.get_tensor(name)
        if dtype is not None:
            t = t.to(dtype)
        return t.to(device)

    def close(self) -> None:
        self._handles.clear()


class OverlayWeights:
    """A ``WeightSource`` whose tensors named in ``overrides`` are replaced (KV methods' load-time folds)."""

    def __init__(self, base: WeightSource, overrides: dict[str, torch.Tensor] | None = None) -> None:
        self.base = base
        self.overrides = dict(overrides or {})

    def __contains__(self, name: str) -> bool:
        return name in self.overrides or name in self.base

    def names(self) -> list[str]:
        return sorted(set(self.base.names()) | set(self.overrides))

    def get_quant(self, name: str):
        """The base's quantized tensor (a GGUF source's ``QTensor``), None for an overridden name."""
        get_quant = getattr(self.base, "get_quant", None)
        return None if name in self.overrides or get_quant is None else get_quant(name)

    def stored_dense(self, name: str) -> bool:
        stored = getattr(self.base, "stored_dense", None)
        return name not in self.overrides and stored is not None and stored(name)

    def get(self, name: str, dtype: torch.dtype | None = None, device: torch.device | str = "cpu") -> torch.Tensor:
        if name not in self.overrides:
            return self.base.get(name, dtype, device)
        t = self.overrides[name]
        return (t.to(dtype) if dtype is not None else t).to(device)

    def close(self) -> None:
        self.base.close()
