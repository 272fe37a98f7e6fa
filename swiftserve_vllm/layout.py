"""What a checkpoint asks of the vLLM model class: SwiftKV layout, AcrossKV groups, ZACK rank.

Read from ``config.json`` alone (no torch, no vLLM), so the worker can log and report
the KV footprint before the engine starts, and the model class and the tests agree on
one layout.

- SwiftKV (Snowflake's format): ``"swiftkv": true``, ``num_key_value_layers = l < L``,
  ``key_value_group_size = g``. Layers ``>= l`` form groups of ``g`` consecutive layers
  (the last may be shorter); the first layer of a group holds ``k/v_proj_swiftkv``.
- ZACK (``"zack"`` object, format_version 1): vLLM serves UNIFORM ranks only (every
  ``k_ranks``/``v_ranks`` entry equal to one ``r``); per-head adaptive ranks stay in
  the reference engine. ``r`` must be a head size the attention backend supports.

Cache owners: layers ``< l`` own one cache each; each SwiftKV group owns one. The KV
bytes per token follow: ``owners * 2 * kv_heads * head_size * dtype_bytes``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

ZACK_FORMAT_VERSION = 1


class LayoutError(ValueError):
    """A checkpoint the vLLM plugin cannot serve; the message says why."""


@dataclass(frozen=True)
class ModelLayout:
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    swiftkv: bool                  # SwiftKV on (a SwiftKV checkpoint, not disabled)
    num_kv_layers: int             # l (== num_layers without SwiftKV)
    group_size: int                # g (1 without SwiftKV)
    zack_rank: int | None          # uniform ZACK rank r, None without ZACK
    zack_file: str | None = None   # rotations file, relative to the model directory

    @property
    def kv_head_size(self) -> int:
        """Per-head K/V width actually stored in the cache."""
        return self.zack_rank if self.zack_rank is not None else self.head_dim

    @property
    def group_leaders(self) -> list[int]:
        """First layer of each SwiftKV group (empty without SwiftKV)."""
        if not self.swiftkv:
            return []
        return list(range(self.num_kv_layers, self.num_layers, self.group_size))

    def leader_of(self, layer: int) -> int:
        """The layer whose K/V ``layer`` reads (itself below l)."""
        if not self.swiftkv or layer < self.num_kv_layers:
            return layer
        return self.num_kv_layers + (layer - self.num_kv_layers) // self.group_size * self.group_size

    @property
    def num_cache_owners(self) -> int:
        return self.num_kv_layers + len(self.group_leaders) if self.swiftkv else self.num_layers

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return self.num_cache_owners * 2 * self.num_kv_heads * self.kv_head_size * dtype_bytes

    def baseline_kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * dtype_bytes


def _zack_rank(zack: dict, num_layers: int, num_kv_heads: int, head_dim: int) -> int:
    version = zack.get("format_version")
    if version != ZACK_FORMAT_VERSION:
        raise LayoutError(f"ZACK format_version {version!r} is not supported (expected {ZACK_FORMAT_VERSION})")
    ranks = []
    for key in ("k_ranks", "v_ranks"):
        rows = zack.get(key)
        if not isinstance(rows, list) or len(rows) != num_layers or any(
                not isinstance(r, list) or len(r) != num_kv_heads for r in rows):
            raise LayoutError(f"ZACK {key} must be [[rank per KV head] per layer] for {num_layers} layers "
                              f"x {num_kv_heads} KV heads")
        ranks.extend(int(v) for row in rows for v in row)
    distinct = sorted(set(ranks))
    if len(distinct) != 1:
        raise LayoutError(
            f"ZACK checkpoint has per-head adaptive ranks ({distinct[0]}..{distinct[-1]}, mode "
            f"{zack.get('mode')!r}); the vLLM engine serves uniform ranks only (one head size for the "
            "whole KV cache). Serve it with the reference engine, or calibrate with mode 'uniform'.")
    r = distinct[0]
    if not 1 <= r <= head_dim:
        raise LayoutError(f"ZACK rank {r} must be in [1, {head_dim}]")
    return r


def parse_layout(cfg: dict, use_swiftkv: bool = True) -> ModelLayout:
    L = int(cfg["num_hidden_layers"])
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    l = int(cfg.get("num_key_value_layers") or L)
    g = int(cfg.get("key_value_group_size") or 1)
    swiftkv = bool(use_swiftkv and cfg.get("swiftkv", False) and l < L)
    if swiftkv and not 1 <= l < L:
        raise LayoutError(f"num_key_value_layers={l} must be in [1, {L})")
    if g < 1:
        raise LayoutError("key_value_group_size must be >= 1")
    zack = cfg.get("zack")
    rank, zfile = None, None
    if zack is not None:
        if not isinstance(zack, dict):
            raise LayoutError("config.json 'zack' must be an object")
        rank = _zack_rank(zack, L, kv_heads, head_dim)
        zfile = str(zack.get("rotations") or "zack.safetensors")
    return ModelLayout(num_layers=L, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, swiftkv=swiftkv,
                       num_kv_layers=l if swiftkv else L, group_size=g if swiftkv else 1, zack_rank=rank,
                       zack_file=zfile)


def load_layout(model_dir: str | Path, use_swiftkv: bool = True) -> ModelLayout:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise LayoutError(f"{model_dir} has no config.json")
    return parse_layout(json.loads(path.read_text()), use_swiftkv)


def is_zack_dir(model_dir: str | Path) -> bool:
    path = Path(model_dir) / "config.json"
    return path.is_file() and "zack" in json.loads(path.read_text())
