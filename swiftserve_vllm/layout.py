"""What a checkpoint asks of the vLLM model class: family, SwiftKV layout, AcrossKV groups, ZACK ranks.

Read from ``config.json`` alone (no torch, no vLLM; the ZACK format module is torch-free
too), so the worker can log and report the KV footprint before the engine starts, and
the model class and the tests agree on one layout.

- Families (``model_type``, a ``_swiftkv`` suffix stripped): Llama and Mistral, Qwen2 (q/k/v
  biases), Qwen3 (per-head RMSNorm of Q and K before RoPE). Per-layer sliding windows come
  from ``layer_types``; a model-level window is vLLM's own (``cache_config.sliding_window``).
  Other families (Gemma 3) are the reference engine's; stock vLLM serves them without SwiftKV.
- SwiftKV (Snowflake's format, read by ``refengine.swiftkv_format``): ``"swiftkv": true``,
  ``num_key_value_layers = l < L``, ``key_value_group_size = g``. Layers ``>= l`` form groups of ``g`` consecutive layers
  (the last may be shorter); the first layer of a group holds ``k/v_proj_swiftkv``.
- ZACK (``"zack"`` object, read by ``refengine.kv.methods.zack.format``): vLLM serves one
  rank per layer (every ``k_ranks``/``v_ranks`` entry of a layer equal): uniform ranks, or layer-wise ranks that
  differ between layers (vLLM gives each head size its own cache group and scales the
  block size so that every page has the same bytes); per-head adaptive ranks stay in the
  reference engine. Each rank must be a head size the attention backend supports.

Cache owners: layers ``< l`` own one cache each; each SwiftKV group owns one. The KV
bytes per token follow: ``sum over owners of 2 * kv_heads * head_size * dtype_bytes``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from refengine import swiftkv_format                              # torch-free: the one SwiftKV format
from refengine.kv.methods.zack import format as zack_format      # torch-free: the one ZACK format

FAMILIES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}


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
    zack_ranks: tuple[int, ...] | None = None   # ZACK rank of every layer, None without ZACK
    zack_file: str | None = None   # rotations file, relative to the model directory
    family: str = "llama"          # llama (Llama, Mistral), qwen2, qwen3
    qkv_bias: bool = False         # biases on q/k/v (and the SwiftKV projections)
    o_bias: bool = False
    qk_norm: bool = False          # Qwen3: RMSNorm over each head of Q and K, before RoPE
    windows: tuple[int | None, ...] = ()    # per-layer sliding window (() = none per layer)

    def window(self, layer: int) -> int | None:
        return self.windows[layer] if self.windows else None

    @property
    def zack(self) -> bool:
        return self.zack_ranks is not None

    @property
    def zack_rank(self) -> int | None:
        """The one ZACK rank of every layer (uniform ranks); None without ZACK or with layer-wise ranks."""
        return self.zack_ranks[0] if self.zack_ranks and len(set(self.zack_ranks)) == 1 else None

    def kv_head_size(self, layer: int) -> int:
        """Per-head K/V width stored in the cache ``layer`` reads."""
        return self.zack_ranks[self.leader_of(layer)] if self.zack_ranks else self.head_dim

    @property
    def group_leaders(self) -> list[int]:
        """First layer of each SwiftKV group (empty without SwiftKV)."""
        if not self.swiftkv:
            return []
        return list(swiftkv_format.group_leaders(self.num_layers, self.num_kv_layers, self.group_size))

    def group_leader(self, group: int) -> int:
        """First layer of SwiftKV group ``group`` (it holds the group's ``k/v_proj_swiftkv``)."""
        return self.num_kv_layers + group * self.group_size

    def group_of(self, layer: int) -> int:
        """Index of the SwiftKV group of a later layer (``layer >= l``)."""
        return (layer - self.num_kv_layers) // self.group_size

    def leader_of(self, layer: int) -> int:
        """The layer whose K/V ``layer`` reads (itself below l)."""
        if not self.swiftkv or layer < self.num_kv_layers:
            return layer
        return self.num_kv_layers + (layer - self.num_kv_layers) // self.group_size * self.group_size

    @property
    def num_cache_owners(self) -> int:
        return self.num_kv_layers + len(self.group_leaders) if self.swiftkv else self.num_layers

    @property
    def cache_owners(self) -> list[int]:
        """The layers whose caches exist: every layer below l, the first of each SwiftKV group."""
        return list(range(self.num_kv_layers)) + self.group_leaders if self.swiftkv else list(range(self.num_layers))

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return sum(2 * self.num_kv_heads * self.kv_head_size(o) * dtype_bytes for o in self.cache_owners)

    def baseline_kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * dtype_bytes


def kv_head_ids(num_kv_heads: int, tp: int, rank: int) -> list[int]:
    """Global KV heads held by ``rank``: a contiguous share, or one replicated head when tp > kv heads."""
    if num_kv_heads % tp == 0:
        n = num_kv_heads // tp
        return list(range(rank * n, (rank + 1) * n))
    if tp % num_kv_heads == 0:
        return [rank // (tp // num_kv_heads)]
    raise ValueError(f"{num_kv_heads} KV heads cannot be split over tensor_parallel_size={tp}")


@dataclass(frozen=True)
class RankSlice:
    """What one pipeline-parallel rank holding layers ``[start, end)`` runs (the whole model at pp=1)."""
    start: int
    end: int
    first: bool
    last: bool
    head_layers: tuple[int, ...]     # own K/V: layers < l (every layer without SwiftKV)
    tail_layers: tuple[int, ...]     # SwiftKV readers: layers >= l
    groups: tuple[int, ...]          # SwiftKV groups whose caches this rank owns and writes
    owns_split: bool                 # holds layer l-1: computes x = norm_swiftkv(h)
    uses_incoming_x: bool            # starts after l-1: gets x from the previous rank


def rank_slice(layout: ModelLayout, start: int, end: int, first: bool = True, last: bool = True) -> RankSlice:
    """The slice of ``layout`` one rank runs; a SwiftKV group split between two ranks is refused
    (its one cache would have readers in two processes)."""
    l = layout.num_kv_layers
    layers = range(start, end)
    if not layout.swiftkv:
        return RankSlice(start, end, first, last, tuple(layers), (), (), False, False)
    tail = tuple(i for i in layers if i >= l)
    groups = tuple(sorted({layout.group_of(i) for i in tail}))
    for g in groups:
        members = range(layout.group_leader(g), min(layout.group_leader(g + 1), layout.num_layers))
        if not all(start <= i < end for i in members):
            raise LayoutError(
                f"pipeline stage [{start}, {end}) splits the SwiftKV group of layers {members.start}..{members.stop - 1} "
                "(one KV cache cannot be read by two stages); choose a partition whose boundaries fall on group "
                "boundaries with VLLM_PP_LAYER_PARTITION")
    return RankSlice(start, end, first, last, tuple(i for i in layers if i < l), tail, groups,
                     start <= l - 1 < end, start >= l)


def _zack_ranks(zack: dict, num_layers: int, num_kv_heads: int, head_dim: int) -> tuple[int, ...]:
    try:
        zack_format.check_version(zack)
        k_rows, v_rows = zack_format.served_ranks(zack, num_layers, num_kv_heads)
    except zack_format.FormatError as exc:
        raise LayoutError(str(exc)) from None
    ranks = []
    for i, (k, v) in enumerate(zip(k_rows, v_rows)):
        distinct = sorted(set(k + v))
        if len(distinct) != 1:
            raise LayoutError(
                f"ZACK checkpoint has per-head adaptive ranks (layer {i}: {distinct[0]}..{distinct[-1]}, mode "
                f"{zack.get('mode')!r}); the vLLM engine serves one rank per layer (one head size per cache). "
                "Serve it with the reference engine, or plan uniform or layer-wise ranks "
                "(--kv-methods '{\"zack\": {\"rate\": R, \"mode\": \"uniform\"}}').")
        if not 1 <= distinct[0] <= head_dim:
            raise LayoutError(f"ZACK rank {distinct[0]} of layer {i} must be in [1, {head_dim}]")
        ranks.append(distinct[0])
    return tuple(ranks)


def parse_layout(cfg: dict, use_swiftkv: bool = True) -> ModelLayout:
    L = int(cfg["num_hidden_layers"])
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    try:
        sk = swiftkv_format.read_fields(cfg, L)
    except swiftkv_format.SwiftKVFormatError as exc:
        raise LayoutError(str(exc)) from None
    l, g, swiftkv = sk.num_kv_layers, sk.group_size, use_swiftkv and sk.on
    zack = cfg.get("zack")
    ranks, zfile = None, None
    if zack is not None:
        if not isinstance(zack, dict):
            raise LayoutError("config.json 'zack' must be an object")
        ranks = _zack_ranks(zack, L, kv_heads, head_dim)
        zfile = zack_format.rotations_file(zack)
    model_type = str(cfg.get("model_type") or "llama").removesuffix("_swiftkv")
    if model_type not in FAMILIES:
        raise LayoutError(f"model type {model_type!r}: the vLLM plugin serves {', '.join(FAMILIES)} (SwiftKV, ZACK); "
                          "serve this model with --engine reference, or without SwiftKV/ZACK with stock vLLM")
    family = FAMILIES[model_type]
    types = cfg.get("layer_types")
    windows: tuple[int | None, ...] = ()
    if isinstance(types, list) and len(types) == L and "sliding_attention" in types:
        windows = tuple(int(cfg["sliding_window"]) if t == "sliding_attention" else None for t in types)
    bias = bool(cfg.get("attention_bias", False))
    lay = ModelLayout(num_layers=L, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, swiftkv=swiftkv,
                      num_kv_layers=l if swiftkv else L, group_size=g if swiftkv else 1, zack_ranks=ranks,
                      zack_file=zfile, family=family, qkv_bias=family == "qwen2" or bias or bool(cfg.get("qkv_bias")),
                      o_bias=bias, qk_norm=family == "qwen3", windows=windows)
    if ranks is not None and any(ranks[i] != ranks[lay.leader_of(i)] for i in range(L)):
        raise LayoutError("ZACK ranks must be equal within a SwiftKV/AcrossKV group (its layers share one cache)")
    if any(lay.window(i) != lay.window(lay.leader_of(i)) for i in range(L)):
        raise LayoutError("a SwiftKV/AcrossKV group mixes windowed and global layers (one cache, one window)")
    return lay


def load_layout(model_dir: str | Path, use_swiftkv: bool = True) -> ModelLayout:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise LayoutError(f"{model_dir} has no config.json")
    return parse_layout(json.loads(path.read_text()), use_swiftkv)


def is_zack_dir(model_dir: str | Path) -> bool:
    path = Path(model_dir) / "config.json"
    return path.is_file() and "zack" in json.loads(path.read_text())
