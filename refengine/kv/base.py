"""The KV-method interface. No torch at import time.

A method is built from its options (a strict pydantic model: unknown keys, wrong
types and out-of-range values are refused with a message naming the option), then
takes part in three phases:

1. Planning (torch-free, before any weight is read): ``validate(facts)`` returns
   reasons the method cannot run on this model; ``configure(group, facts)`` edits
   the ``GroupSpec`` of every cache slot it applies to (dimensions, codec, where V
   lives, whether tokens may be evicted).
   ``reserved_bytes(spec, limits)`` is device memory the method needs besides the
   block pool (ZipCache's full-precision window); the pool budget shrinks by it.
2. Loading (torch): ``weight_overrides(facts, spec, weights)`` returns replaced
   tensors by checkpoint name (e.g. ZACK folds its V rotation into V and O);
   ``qk_transform(group)`` may return the transform applied to queries and keys
   after RoPE (ZACK); ``make_store(...)`` builds the storage of a codec;
   ``wrap_attention(group, op)`` may replace the attention operation of a slot
   (KCache's top-N, a codec's fused kernel).
3. Serving, once per engine step (``sched`` is the scheduler's output; chunks carry
   request, true positions and cache offsets): ``begin_step(sched, cache)`` before the
   forward pass; ``after_step(sched, cache)`` after the scheduler recorded the sampled
   tokens, returning ``Truncate`` edits the engine applies through the scheduler
   (eviction: the method has compacted the request's cache entries to the front;
   the scheduler frees the blocks past them, positions stay); ``forget(ids)`` when
   requests finish, abort or are preempted (drop per-request state; their blocks
   are already free); ``stats()`` adds gauges to ``/metrics``.

Prefix caching: ``prefix_cacheable`` / ``prefix_cache_key()`` say whether and under which
key the blocks a method stores may be shared between requests with the same prefix.

Every hook has a do-nothing default; a method overrides what it needs. Its
``role`` says which composition rules apply (see ``refengine.kv.registry``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from refengine.kv.spec import CacheSpec, EngineLimits, GroupSpec, ModelFacts

if TYPE_CHECKING:  # pragma: no cover
    import torch

ROLES = ("dims", "codec", "placement", "eviction")


@dataclass(frozen=True)
class Truncate:
    """Edit returned by ``after_step``: the request's cache now holds its first ``num_cached`` entries."""

    request_id: str
    num_cached: int


class MethodError(ValueError):
    """A ``--kv-methods`` value that cannot be used; the message is meant for the user."""


class Options(BaseModel):
    """Base of every method's options: strict types, no unknown keys, immutable."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def _explain(name: str, exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(options)"
        got = err.get("input")
        shown = "" if err["type"] == "missing" or isinstance(got, dict) else f" (got {got!r})"
        parts.append(f"{name}.{loc}: {err['msg']}{shown}")
    return "; ".join(parts)


class KVMethod:
    name: ClassVar[str]
    role: ClassVar[str]
    OptionsModel: ClassVar[type[Options]] = Options
    summary: ClassVar[str] = ""
    # Methods this one cannot be combined with: name -> the reason given to the user.
    refuses: ClassVar[dict[str, str]] = {}
    # Prefix caching shares a block between requests with the same token prefix, so what a
    # block stores must be a function of those tokens (and of the method's options, which key
    # the cache through ``prefix_cache_key``). A method whose stored entries depend on later
    # tokens or change after being written (eviction, saliency-ranked codecs) sets this False
    # and the engine turns prefix caching off.
    prefix_cacheable: ClassVar[bool] = True
    # The KV block size this method serves best with, used when the user leaves the block size
    # unset (``EngineConfig.block_size=None``, the worker's default); None: no preference.
    block_size: ClassVar[int | None] = None

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        try:
            self.opts = self.OptionsModel(**(options or {}))
        except ValidationError as exc:
            raise MethodError(_explain(self.name, exc)) from None
        except TypeError as exc:      # e.g. non-string keys
            raise MethodError(f"{self.name}: {exc}") from None

    def __repr__(self) -> str:
        return f"{self.name}({self.opts.model_dump()})"

    def prefix_cache_key(self) -> str | None:
        """What keys this method's cached blocks (its name and options), or None: not cacheable."""
        return repr(self) if self.prefix_cacheable else None

    # ---- planning (no torch) ---------------------------------------------
    def validate(self, facts: ModelFacts) -> list[str]:
        return []

    def applies_to(self, group: GroupSpec) -> bool:
        return True

    def configure(self, group: GroupSpec, facts: ModelFacts) -> GroupSpec:
        return group

    def reserved_bytes(self, spec: CacheSpec, limits: EngineLimits) -> int:
        return 0

    # ---- loading (torch) -------------------------------------------------
    def weight_overrides(self, facts: ModelFacts, spec: CacheSpec, weights) -> dict[str, "torch.Tensor"]:
        return {}

    def qk_transform(self, group: GroupSpec, device, dtype):
        return None

    def make_store(self, group: GroupSpec, which: str, heads: int, dims: int, num_blocks: int, block_size: int,
                   dtype, device, pin: bool = False):
        """A store for K (``which="k"``) or V of ``heads`` heads of ``dims`` each, or None (built-in codec)."""
        return None

    def wrap_attention(self, group: GroupSpec, op):
        return op

    # ---- serving ---------------------------------------------------------
    def begin_step(self, sched, cache) -> None:
        return None

    def after_step(self, sched, cache) -> list[Truncate]:
        return []

    def forget(self, request_ids) -> None:
        return None

    def stats(self) -> dict[str, float]:
        return {}
