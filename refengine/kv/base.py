"""The KV-method interface. No torch at import time.

A method is built from its options (a strict pydantic model: unknown keys, wrong
types and out-of-range values are refused with a message naming the option), then
takes part in three phases:

1. Planning (torch-free, before any weight is read): ``validate(facts)`` returns
   reasons the method cannot run on this model; ``configure(group, facts)`` edits
   the ``GroupSpec`` of every cache slot it applies to (dimensions, codec, where V
   lives, whether tokens may be evicted).
2. Loading (torch): ``weight_overrides(facts, spec, weights)`` returns replaced
   tensors by checkpoint name (e.g. ZACK folds its V rotation into V and O);
   ``qk_transform(group)`` may return the transform applied to queries and keys
   after RoPE (ZACK); ``make_store(...)`` builds the storage of a codec;
   ``wrap_attention(group, op)`` may replace the attention operation of a slot
   (KCache's top-N, a codec's fused kernel).
3. Serving: ``after_step(...)`` may return edits to apply through the scheduler
   (eviction); ``stats()`` adds gauges to ``/metrics``.

Every hook has a do-nothing default; a method overrides what it needs. Its
``role`` says which composition rules apply (see ``refengine.kv.registry``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from refengine.kv.spec import CacheSpec, GroupSpec, ModelFacts

if TYPE_CHECKING:  # pragma: no cover
    import torch

ROLES = ("dims", "codec", "placement", "eviction")


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

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        try:
            self.opts = self.OptionsModel(**(options or {}))
        except ValidationError as exc:
            raise MethodError(_explain(self.name, exc)) from None
        except TypeError as exc:      # e.g. non-string keys
            raise MethodError(f"{self.name}: {exc}") from None

    def __repr__(self) -> str:
        return f"{self.name}({self.opts.model_dump()})"

    # ---- planning (no torch) ---------------------------------------------
    def validate(self, facts: ModelFacts) -> list[str]:
        return []

    def applies_to(self, group: GroupSpec) -> bool:
        return True

    def configure(self, group: GroupSpec, facts: ModelFacts) -> GroupSpec:
        return group

    # ---- loading (torch) -------------------------------------------------
    def weight_overrides(self, facts: ModelFacts, spec: CacheSpec, weights) -> dict[str, "torch.Tensor"]:
        return {}

    def qk_transform(self, group: GroupSpec, device, dtype):
        return None

    def make_store(self, group: GroupSpec, heads: int, dims: int, num_blocks: int, block_size: int,
                   dtype, device):
        return None

    def wrap_attention(self, group: GroupSpec, op):
        return op

    # ---- serving ---------------------------------------------------------
    def after_step(self, step) -> list | None:
        return None

    def stats(self) -> dict[str, float]:
        return {}
