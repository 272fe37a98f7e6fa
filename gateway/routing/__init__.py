"""Routing policies by name: ``make_policy("prefix" | "jsq" | "p2c" | "round_robin" | "kv")``.

``prefix`` (``prefix_aware``): expected cached prompt prefix vs effective load, with a
bounded-load rule; the default, for prompt-heavy traffic. The load-only policies are in
``load``; the shared worker state, effective load and request are in ``base``. This module
only chooses: it imports the policy modules, which import ``base`` and never each other.
"""

from __future__ import annotations

from gateway.prefix import PrefixIndex
from gateway.routing.load import RoundRobin, jsq, kv_aware, p2c
from gateway.routing.prefix_aware import PrefixAware

POLICIES = ("prefix", "jsq", "p2c", "round_robin", "kv")


def make_policy(name: str, prefix_index=None, **prefix_options):
    """A policy callable ``(workers, now, stale_after, rng, req=None) -> worker | None``."""
    table = {"jsq": jsq, "p2c": p2c, "kv": kv_aware}
    if name in table:
        return table[name]
    if name == "round_robin":
        return RoundRobin()
    if name == "prefix":
        return PrefixAware(prefix_index if prefix_index is not None else PrefixIndex(), **prefix_options)
    raise ValueError(f"unknown routing policy {name!r} ({', '.join(POLICIES)})")
