"""Registered KV methods, the typed ``--kv-methods`` value, and the one check of a KV setting. No torch.

``--kv-methods`` is a JSON object: method name -> options object (``{}`` or ``true``
for the defaults; ``false`` turns off a method the model directory enables by
itself, e.g. a ZACK model). It is decoded once, where a configuration is built,
into ``KVMethods`` (``KVMethods.parse``: names and each method's options checked;
an immutable mapping of name -> the value as given). ``validate(methods, facts,
kv_cache_dtype)`` is the one check of a KV setting against everything that
decides it (the model and SwiftKV on/off through ``ModelFacts``, the block size in
the facts, the KV cache dtype); it raises ``MethodError`` with every reason and
returns the ``KVPlan`` (methods in role order + the ``CacheSpec`` the pool is
sized from). ``check_engine(config)`` runs it for an ``EngineConfig``: the worker
CLI (and so ``swiftserve up``, before any worker starts) and the engine call it,
the engine once with its real element size, and use that one plan.

Composition rules:
1. SwiftKV is the layout, not a method: methods act per cache slot, and a slot
   shared by an AcrossKV group is configured once for all of its layers.
2. Methods apply in role order: ``dims`` (ZACK: per-head K/V sizes) -> ``codec``
   (fp8 or a packed format: how each stored element is encoded, at the sizes
   ``dims`` chose) -> ``placement`` (KCache: where V lives) -> ``eviction``
   (which tokens stay; it acts only after a step, through the scheduler, so
   positions stay right).
3. At most one method per role: two codecs (``--kv-cache-dtype fp8`` is the fp8
   codec) or two dimension methods are refused, not silently stacked.
4. Only a ``dims`` method may transform queries and keys (after RoPE, before the
   cache write); RoPE is applied before ``write``, so no method re-rotates keys.
5. A method that refuses a model (``validate``) stops the start with its reason.
6. Pairs a method declares impossible (``KVMethod.refuses``) are refused with its reason:
   eviction x zipcache (whole-block quantisation vs moving single tokens) and
   kcache x zipcache (dense top-N V rows from the host vs packed V with its own op).
   Every other pair composes: eviction compacts any dense or fp8 store, host V
   included; KCache's top-N runs on ZACK's compressed heads and on fp8.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from refengine.kv.base import ROLES, KVMethod, MethodError
from refengine.kv.methods.eviction.method import EvictionMethod
from refengine.kv.methods.fp8.method import Fp8Method
from refengine.kv.methods.kcache.method import KCacheMethod
from refengine.kv.methods.zack.method import ZackMethod
from refengine.kv.methods.zipcache.method import ZipCacheMethod
from refengine.kv.spec import CacheSpec, ModelFacts

if TYPE_CHECKING:  # pragma: no cover
    from refengine.model_config import ModelSpec


class EngineInputs(Protocol):
    """What ``check_engine`` reads of an ``EngineConfig`` (named structurally: ``refengine.config``
    imports this module for ``KVMethods``, so importing it back would close a circle)."""

    model: str
    swiftkv: bool
    block_size: int
    kv_methods: KVMethods
    kv_cache_dtype: str

# The one list of methods: the CLI's help, validation and the shared tests all read it.
METHODS: dict[str, type[KVMethod]] = {m.name: m for m in (ZackMethod, Fp8Method, ZipCacheMethod, KCacheMethod,
                                                           EvictionMethod)}

# Methods a model directory turns on by itself (config.json key -> method name).
AUTO_FROM_CONFIG = {"zack": "zack"}

KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")


def describe() -> str:
    return "; ".join(f"{n} ({m.role}): {m.summary}" for n, m in METHODS.items())


def _options(value: Any) -> dict:
    """A method's options as given (``true`` / ``null``: the defaults)."""
    return {} if value is True or value is None else value


@dataclass(frozen=True, eq=False)
class KVMethods(Mapping):
    """``--kv-methods`` decoded: method name -> the value as given (options object, true or false).

    Invariant: every name is registered and every options object was accepted by its method
    (``parse`` is the only way in). Immutable; equal to a dict with the same items, so code
    that reads it as the JSON object it came from keeps working.
    """

    given: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def parse(cls, value: KVMethods | Mapping | str | None) -> KVMethods:
        """JSON text, a dict or None -> ``KVMethods``; ``MethodError`` with every reason otherwise."""
        if isinstance(value, KVMethods):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise MethodError(f"not valid JSON: {exc}") from None
        value = {} if value is None else value
        if not isinstance(value, Mapping):
            raise MethodError("--kv-methods must be a JSON object of method name -> options")
        reasons: list[str] = []
        for name, opts in value.items():
            if name not in METHODS:
                reasons.append(f"unknown KV method {name!r} (known: {', '.join(METHODS)})")
            elif not (opts is False or opts is True or opts is None or isinstance(opts, dict)):
                reasons.append(f"{name}: options must be a JSON object (or true/false), got {json.dumps(opts)}")
            elif opts is not False:
                try:
                    METHODS[name](_options(opts))       # the method's own option checks
                except MethodError as exc:
                    reasons.append(str(exc))
        if reasons:
            raise MethodError("; ".join(reasons))
        return cls(tuple((name, copy.deepcopy(opts)) for name, opts in value.items()))

    def __getitem__(self, name: str) -> Any:
        for key, opts in self.given:
            if key == name:
                return opts
        raise KeyError(name)

    def __iter__(self):
        return (name for name, _ in self.given)

    def __len__(self) -> int:
        return len(self.given)

    def __repr__(self) -> str:
        return f"KVMethods({self.to_json()})"

    def to_json(self) -> str:
        """The value as ``--kv-methods`` text (what ``swiftserve up`` hands its workers)."""
        return json.dumps(dict(self.given))


DEFAULT_BLOCK_SIZE = 16


def default_block_size(methods: KVMethods | Mapping | str | None) -> int:
    """The block size when none is given: the largest any asked-for method prefers (ZipCache: 32,
    which halves its per-block quantisation metadata per token), else ``DEFAULT_BLOCK_SIZE``."""
    methods = KVMethods.parse(methods)
    wanted = [METHODS[n].block_size for n in methods if methods[n] is not False and METHODS[n].block_size]
    return max(wanted, default=DEFAULT_BLOCK_SIZE)


@dataclass(frozen=True)
class KVPlan:
    """A checked KV setting: the methods in role order and the cache they plan.

    The methods are the objects the plan configured (some keep what ``configure`` chose,
    e.g. ZipCache's layout): the engine serves with these, it does not build others.
    """

    methods: tuple[KVMethod, ...]
    spec: CacheSpec
    facts: ModelFacts


def compose(methods: KVMethods | Mapping | None, facts: ModelFacts | None = None,
            kv_cache_dtype: str = "auto") -> list[KVMethod]:
    """Methods asked for + those implied by the model directory and ``--kv-cache-dtype``, in
    role order; composition rules 3 and 6 (and the dtype) checked, ``MethodError`` otherwise."""
    methods = KVMethods.parse(methods)
    reasons: list[str] = []
    wanted = {name: _options(opts) for name, opts in methods.items() if opts is not False}
    if facts is not None:
        for key, name in AUTO_FROM_CONFIG.items():
            if facts.config.get(key) is not None and name not in methods:
                wanted[name] = {}
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        reasons.append(f"kv cache dtype {kv_cache_dtype!r} is not 'auto' or 'fp8_e4m3'")
    elif kv_cache_dtype != "auto":
        if methods.get("fp8", None) is False:
            reasons.append("--kv-cache-dtype fp8 contradicts \"fp8\": false in --kv-methods")
        wanted.setdefault("fp8", {})
    chosen = [METHODS[name](opts) for name, opts in wanted.items()]
    by_role: dict[str, list[str]] = {}
    for m in chosen:
        by_role.setdefault(m.role, []).append(m.name)
    for role, names in by_role.items():
        if len(names) > 1:
            what = "two KV codecs" if role == "codec" else f"two {role} methods"
            reasons.append(f"{what} cannot be combined: {' and '.join(names)} (at most one {role} method)")
    names = {m.name for m in chosen}
    for m in chosen:
        for other, why in m.refuses.items():
            if other in names:
                reasons.append(f"{m.name} cannot be combined with {other}: {why}")
    if reasons:
        raise MethodError("; ".join(reasons))
    return sorted(chosen, key=lambda m: ROLES.index(m.role))


def plan(methods, facts: ModelFacts) -> CacheSpec:
    """The cache spec after every method configured the slots it applies to."""
    spec = CacheSpec.for_model(facts)
    groups = list(spec.groups)
    for m in methods:
        groups = [m.configure(g, facts) if m.applies_to(g) else g for g in groups]
    return spec.replace_groups(groups)


def validate(methods: KVMethods | Mapping | None, facts: ModelFacts, kv_cache_dtype: str = "auto") -> KVPlan:
    """The one check of a KV setting: composition, every method against the model (``facts``
    carry SwiftKV on/off and the block size), then the plan (spec-level checks, e.g.
    dimensions, raise there). ``MethodError`` lists every reason of the failing stage."""
    chosen = compose(methods, facts, kv_cache_dtype)
    reasons = [f"{m.name}: {r}" for m in chosen for r in m.validate(facts)]
    if reasons:
        raise MethodError("; ".join(reasons))
    return KVPlan(tuple(chosen), plan(chosen, facts), facts)


def check_engine(config: EngineInputs, spec: ModelSpec | None = None, elem_bytes: int = 4) -> KVPlan:
    """``validate`` with every input an ``EngineConfig`` holds. ``spec``: the model's, read from
    ``config.model`` when None; ``elem_bytes``: the compute dtype's size (it sizes the plan; no
    rule reads it, so a CLI that does not know the device yet passes the default)."""
    if spec is None:
        from refengine.model_config import load_model_spec

        spec = load_model_spec(config.model)
    facts = facts_from_spec(spec, config.model, config.swiftkv, elem_bytes, config.block_size)
    return validate(config.kv_methods, facts, config.kv_cache_dtype)


def facts_for(model_dir: str | Path, swiftkv: bool = True, elem_bytes: int = 4,
              block_size: int = DEFAULT_BLOCK_SIZE) -> ModelFacts:
    """``ModelFacts`` of a model directory without loading weights (for CLIs' early validation)."""
    from refengine.model_config import load_model_spec

    spec = load_model_spec(model_dir)
    return facts_from_spec(spec, str(model_dir), swiftkv, elem_bytes, block_size)


def facts_from_spec(spec, model_dir: str, swiftkv: bool, elem_bytes: int,
                    block_size: int = DEFAULT_BLOCK_SIZE) -> ModelFacts:
    on = bool(swiftkv and spec.swiftkv)
    return ModelFacts(model_dir=str(model_dir), num_layers=spec.num_layers, num_heads=spec.num_heads,
                      num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim, elem_bytes=elem_bytes,
                      swiftkv_layers=spec.num_key_value_layers if on else None,
                      group_size=spec.key_value_group_size if on else 1, config=spec.raw, block_size=block_size,
                      layer_windows=tuple(spec.layer_windows))


def check(methods: KVMethods | Mapping | None, model_dir: str | Path, swiftkv: bool = True,
          kv_cache_dtype: str = "auto", block_size: int | None = None) -> str | None:
    """``validate`` for a model directory: None when the methods can serve it, else the reasons."""
    try:
        methods = KVMethods.parse(methods)
        bs = default_block_size(methods) if block_size is None else block_size
        validate(methods, facts_for(model_dir, swiftkv, block_size=bs), kv_cache_dtype)
    except (MethodError, ValueError) as exc:
        return str(exc)
    return None
