"""What the KV cache stores, per cache slot and per KV head, and what it costs. No torch.

A *slot* is one cache allocation read by one or more layers: every layer below
SwiftKV's ``l`` owns one; later layers share one per AcrossKV group. KV methods
edit a slot's ``GroupSpec`` before anything is allocated (ZACK sets per-head
dimensions, a codec sets the storage format, KCache moves V to the host), and the
spec computes its own device and host bytes per token from the result, so the
block pool is sized by what is really stored.

Heads of one slot with equal ``(k_dim, v_dim)`` form a ``HeadPart``; each part is
one dense tensor per K and V, so heads of different ranks never pay for the padded
maximum. ``parts`` are ordered by their first head. The flat layouts that weights
folded at load time must follow (ZACK's V and O) are defined here once:

- V entering the cache (the V projection's output): the parts' heads in part order,
  each head ``v_dim`` wide.
- Attention output (the O projection's input): for each part, for each of its KV
  heads, that head's ``q_per_kv`` query heads, each ``v_dim`` wide.
With one part (every head the same size) both are the model's usual head order.

Bytes are exact per *block* (``block_size`` tokens): a packed codec keeps metadata
per block (ZipCache's per-channel K ranges), so a token's share may be fractional.
``*_bytes_per_token`` = bytes per block / block size; the pool is sized and checked
per block.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

# Bytes of one stored token-head of ``dims`` elements, per codec. A codec method
# (fp8, later packed low-bit formats) registers its arithmetic here by name.
SCALE_BYTES = 4     # one float32 scale per (token, head) for the fp8 codec


def codec_bytes(codec: str, dims: int, elem_bytes: int) -> int:
    """Bytes of one token of one head stored with a per-token ``codec`` (dense, fp8)."""
    if codec == "dense":
        return dims * elem_bytes
    if codec == "fp8":
        return dims + SCALE_BYTES
    raise ValueError(f"unknown KV codec {codec!r}")


def codec_block_bytes(codec: str, dims: int, elem_bytes: int, block_size: int, which: str,
                      codec_args=None) -> int:
    """Bytes of one block of one head. A codec with per-block metadata passes ``codec_args``
    with ``block_bytes(dims, block_size, which)`` (``which``: "k" or "v")."""
    if codec_args is not None and hasattr(codec_args, "block_bytes"):
        return codec_args.block_bytes(dims, block_size, which)
    return codec_bytes(codec, dims, elem_bytes) * block_size


class BlockBytes:
    """Per-token figures derived from per-block ones (``device_bytes_per_block``,
    ``host_bytes_per_block``, ``block_size``): a packed codec's token share may be fractional."""

    @property
    def device_bytes_per_token(self) -> float:
        return self.device_bytes_per_block / self.block_size

    @property
    def host_bytes_per_token(self) -> float:
        return self.host_bytes_per_block / self.block_size


@dataclass(frozen=True)
class EngineLimits:
    """Engine sizes some methods plan fixed buffers with (e.g. ZipCache's full-precision window)."""

    block_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048


@dataclass(frozen=True)
class HeadPart:
    """KV heads of one slot that share dimensions: stored together, attended together."""

    heads: tuple[int, ...]        # KV head indices (ascending)
    k_dim: int
    v_dim: int


@dataclass(frozen=True)
class GroupSpec(BlockBytes):
    """One cache slot: which layers read it and how each KV head is stored."""

    slot: int
    layers: tuple[int, ...]
    kv_heads: int
    head_dim: int                 # the model's head size (queries and keys enter attention at this size)
    q_per_kv: int                 # query heads per KV head (GQA)
    elem_bytes: int               # bytes of one element in the compute dtype
    k_dims: tuple[int, ...]       # stored K size per KV head
    v_dims: tuple[int, ...]       # stored V size per KV head
    codec: str = "dense"          # "dense" (compute dtype) | "fp8" (e4m3 + per-token-head scale) | "zipcache"
    codec_owner: str | None = None  # the method that set the codec (composition checks)
    codec_args: object = None     # hashable codec parameters (a packed layout with block_bytes(...))
    block_size: int = 16          # tokens per block (the unit of allocation)
    v_on_host: bool = False       # V lives in a host pool, not in the device pool
    may_evict: bool = False       # a method may drop tokens of this slot after a step
    window: int | None = None     # sliding window of the slot's layers (None: global attention)
    options: dict = field(default_factory=dict, compare=False)  # method notes (informational)

    def __post_init__(self) -> None:
        if len(self.k_dims) != self.kv_heads or len(self.v_dims) != self.kv_heads:
            raise ValueError("k_dims and v_dims need one entry per KV head")
        if any(d < 1 for d in self.k_dims + self.v_dims):
            raise ValueError("every head keeps at least one dimension")

    @property
    def parts(self) -> list[HeadPart]:
        by_dims: dict[tuple[int, int], list[int]] = {}
        for h, dims in enumerate(zip(self.k_dims, self.v_dims)):
            by_dims.setdefault(dims, []).append(h)
        return [HeadPart(tuple(hs), kd, vd) for (kd, vd), hs in by_dims.items()]

    @property
    def uniform(self) -> bool:
        return len(set(self.k_dims)) == 1 and len(set(self.v_dims)) == 1

    @property
    def v_width(self) -> int:
        return sum(self.v_dims)

    @property
    def out_width(self) -> int:
        return self.q_per_kv * sum(self.v_dims)

    def _block_bytes(self, dims: tuple[int, ...], which: str) -> int:
        return sum(codec_block_bytes(self.codec, d, self.elem_bytes, self.block_size, which, self.codec_args)
                   for d in dims)

    @property
    def k_bytes_per_block(self) -> int:
        return self._block_bytes(self.k_dims, "k")

    @property
    def v_bytes_per_block(self) -> int:
        return self._block_bytes(self.v_dims, "v")

    @property
    def device_bytes_per_block(self) -> int:
        return self.k_bytes_per_block + (0 if self.v_on_host else self.v_bytes_per_block)

    @property
    def host_bytes_per_block(self) -> int:
        return self.v_bytes_per_block if self.v_on_host else 0

    @property
    def k_bytes_per_token(self) -> float:
        return self.k_bytes_per_block / self.block_size

    @property
    def v_bytes_per_token(self) -> float:
        return self.v_bytes_per_block / self.block_size

    def with_(self, **changes) -> "GroupSpec":
        return replace(self, **changes)


@dataclass(frozen=True)
class ModelFacts:
    """The model facts KV methods plan and validate with (built from ``ModelSpec``)."""

    model_dir: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    elem_bytes: int
    swiftkv_layers: int | None    # SwiftKV's l when SwiftKV runs, else None
    group_size: int               # AcrossKV g (1 without)
    config: dict = field(default_factory=dict, compare=False, repr=False)   # raw config.json
    block_size: int = 16          # tokens per KV block of the engine
    layer_windows: tuple = ()     # per layer: sliding window or None (() = none anywhere)


@dataclass(frozen=True)
class CacheSpec(BlockBytes):
    """Every slot of an engine's cache, and which slot each layer reads."""

    groups: tuple[GroupSpec, ...]
    layer_slot: tuple[int, ...]

    @classmethod
    def for_model(cls, facts: ModelFacts) -> "CacheSpec":
        """The uncompressed layout: layers < l own a slot; later layers share one per AcrossKV group."""
        L = facts.num_layers
        l = L if facts.swiftkv_layers is None else facts.swiftkv_layers
        g = facts.group_size if facts.swiftkv_layers is not None else 1
        layer_slot = list(range(l)) + [l + (i - l) // g for i in range(l, L)]
        num_slots = (max(layer_slot) + 1) if layer_slot else 0
        d, kvh = facts.head_dim, facts.num_kv_heads
        slot_layers = [tuple(i for i, x in enumerate(layer_slot) if x == s) for s in range(num_slots)]
        win = facts.layer_windows
        groups = tuple(
            GroupSpec(slot=s, layers=layers, kv_heads=kvh,
                      head_dim=d, q_per_kv=facts.num_heads // kvh, elem_bytes=facts.elem_bytes,
                      k_dims=(d,) * kvh, v_dims=(d,) * kvh, block_size=facts.block_size,
                      window=win[layers[0]] if win else None)
            for s, layers in enumerate(slot_layers))
        return cls(groups, tuple(layer_slot))

    @property
    def windows(self) -> list[int | None]:
        """The distinct windows of the slots, global (None) first: one attention group each."""
        ws = {g.window for g in self.groups}
        return ([None] if None in ws else []) + sorted(w for w in ws if w is not None)

    def window_bytes_per_block(self) -> list[int]:
        """Device bytes per block of the slots of each window (``windows`` order)."""
        return [sum(g.device_bytes_per_block for g in self.groups if g.window == w) for w in self.windows]

    @property
    def num_slots(self) -> int:
        return len(self.groups)

    @property
    def block_size(self) -> int:
        return self.groups[0].block_size if self.groups else 16

    @property
    def device_bytes_per_block(self) -> int:
        return sum(g.device_bytes_per_block for g in self.groups)

    @property
    def host_bytes_per_block(self) -> int:
        return sum(g.host_bytes_per_block for g in self.groups)

    def slot_of(self, layer: int) -> GroupSpec:
        return self.groups[self.layer_slot[layer]]

    def replace_groups(self, groups) -> "CacheSpec":
        return CacheSpec(tuple(groups), self.layer_slot)
