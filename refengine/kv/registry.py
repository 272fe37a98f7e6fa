"""Registered KV methods, how ``--kv-methods`` is parsed, and how methods compose. No torch.

``--kv-methods`` is a JSON object: method name -> options object (``{}`` or ``true``
for the defaults; ``false`` turns off a method the model directory enables by
itself, e.g. a ZACK model). ``build(...)`` parses and validates it against the
model *before* any weight is loaded and raises ``MethodError`` with every reason;
``plan(methods, facts)`` then yields the ``CacheSpec`` the pool is sized from.

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

import json
from pathlib import Path
from typing import Any

from refengine.kv.base import ROLES, KVMethod, MethodError
from refengine.kv.methods.eviction.method import EvictionMethod
from refengine.kv.methods.fp8.method import Fp8Method
from refengine.kv.methods.kcache.method import KCacheMethod
from refengine.kv.methods.zack.method import ZackMethod
from refengine.kv.methods.zipcache.method import ZipCacheMethod
from refengine.kv.spec import CacheSpec, ModelFacts

# The one list of methods: the CLI's help, validation and the shared tests all read it.
METHODS: dict[str, type[KVMethod]] = {m.name: m for m in (ZackMethod, Fp8Method, ZipCacheMethod, KCacheMethod,
                                                           EvictionMethod)}

# Methods a model directory turns on by itself (config.json key -> method name).
AUTO_FROM_CONFIG = {"zack": "zack"}


def describe() -> str:
    return "; ".join(f"{n} ({m.role}): {m.summary}" for n, m in METHODS.items())


def parse(config: dict[str, Any] | None, facts: ModelFacts | None = None,
          kv_cache_dtype: str = "auto") -> list[KVMethod]:
    """``--kv-methods`` (+ methods implied by the model and ``--kv-cache-dtype``) -> methods, role-ordered."""
    config = dict(config or {})
    if not isinstance(config, dict):
        raise MethodError("--kv-methods must be a JSON object of method name -> options")
    reasons: list[str] = []
    wanted: dict[str, dict] = {}
    for name, opts in config.items():
        if name not in METHODS:
            reasons.append(f"unknown KV method {name!r} (known: {', '.join(METHODS)})")
            continue
        if opts is False:
            continue
        if opts is True or opts is None:
            opts = {}
        if not isinstance(opts, dict):
            reasons.append(f"{name}: options must be a JSON object (or true/false), got {json.dumps(opts)}")
            continue
        wanted[name] = opts
    if facts is not None:
        for key, name in AUTO_FROM_CONFIG.items():
            if facts.config.get(key) is not None and name not in config:
                wanted[name] = {}
    if kv_cache_dtype not in ("auto", "fp8", "fp8_e4m3"):
        reasons.append(f"kv cache dtype {kv_cache_dtype!r} is not 'auto' or 'fp8_e4m3'")
    elif kv_cache_dtype != "auto":
        if "fp8" in config and config["fp8"] is False:
            reasons.append("--kv-cache-dtype fp8 contradicts \"fp8\": false in --kv-methods")
        wanted.setdefault("fp8", {})
    methods = []
    for name, opts in wanted.items():
        try:
            methods.append(METHODS[name](opts))
        except MethodError as exc:
            reasons.append(str(exc))
    by_role: dict[str, list[str]] = {}
    for m in methods:
        by_role.setdefault(m.role, []).append(m.name)
    for role, names in by_role.items():
        if len(names) > 1:
            what = "two KV codecs" if role == "codec" else f"two {role} methods"
            reasons.append(f"{what} cannot be combined: {' and '.join(names)} (at most one {role} method)")
    names = {m.name for m in methods}
    for m in methods:
        for other, why in m.refuses.items():
            if other in names:
                reasons.append(f"{m.name} cannot be combined with {other}: {why}")
    if reasons:
        raise MethodError("; ".join(reasons))
    return sorted(methods, key=lambda m: ROLES.index(m.role))


def validate(methods: list[KVMethod], facts: ModelFacts) -> list[str]:
    reasons = []
    for m in methods:
        reasons += [f"{m.name}: {r}" for r in m.validate(facts)]
    return reasons


def plan(methods: list[KVMethod], facts: ModelFacts) -> CacheSpec:
    """The cache spec after every method configured the slots it applies to."""
    spec = CacheSpec.for_model(facts)
    groups = list(spec.groups)
    for m in methods:
        groups = [m.configure(g, facts) if m.applies_to(g) else g for g in groups]
    return spec.replace_groups(groups)


def build(config: dict[str, Any] | None, facts: ModelFacts, kv_cache_dtype: str = "auto") -> list[KVMethod]:
    """Parse + validate; raises ``MethodError`` listing every reason. Used before weights load."""
    methods = parse(config, facts, kv_cache_dtype)
    reasons = validate(methods, facts)
    if reasons:
        raise MethodError("; ".join(reasons))
    plan(methods, facts)                     # spec-level checks (e.g. dimensions) raise here too
    return methods


def facts_for(model_dir: str | Path, swiftkv: bool = True, elem_bytes: int = 4, block_size: int = 16) -> ModelFacts:
    """``ModelFacts`` of a model directory without loading weights (for CLIs' early validation)."""
    from refengine.model_config import load_model_spec

    spec = load_model_spec(model_dir)
    return facts_from_spec(spec, str(model_dir), swiftkv, elem_bytes, block_size)


def facts_from_spec(spec, model_dir: str, swiftkv: bool, elem_bytes: int, block_size: int = 16) -> ModelFacts:
    on = bool(swiftkv and spec.swiftkv)
    return ModelFacts(model_dir=str(model_dir), num_layers=spec.num_layers, num_heads=spec.num_heads,
                      num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim, elem_bytes=elem_bytes,
                      swiftkv_layers=spec.num_key_value_layers if on else None,
                      group_size=spec.key_value_group_size if on else 1, config=spec.raw, block_size=block_size,
                      layer_windows=tuple(spec.layer_windows))


def check(config: dict[str, Any] | None, model_dir: str | Path, swiftkv: bool = True,
          kv_cache_dtype: str = "auto", block_size: int = 16) -> str | None:
    """None when the methods can serve this model; otherwise the reasons, one message."""
    try:
        build(config, facts_for(model_dir, swiftkv, block_size=block_size), kv_cache_dtype)
    except (MethodError, ValueError) as exc:
        return str(exc)
    return None
