"""The models one ``swiftserve up`` serves: ``--model SPEC`` (repeatable), names, worker counts, aliases.

``SPEC`` is a model name (``default``, a shipped variant such as ``SmolLM2-135M-Instruct-SwiftKV-13pct``)
or a directory, optionally followed by ``:N``, the number of workers for that model (else
``--workers``). ``--served-model-name`` may be given once per ``--model``, in the same order (the
default is the directory's name). Two models may not share a served name: the gateway routes by
name (gateway.pools), so the name must say which workers a request may use.

The alias / split configuration is the gateway's (``--alias``, ``--models-config``,
``--shadow-fraction``: gateway.aliases); ``up`` checks it before any process starts: every
target and shadow reference must be one of the served names, since this stack has no other
workers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class ModelSpec:
    source: str                 # as given: a name or a directory
    workers: int
    name: str | None = None     # the served name (--served-model-name); None: the directory's name
    dir: Path | None = None     # resolved by ``up`` (modelkit.models.resolve_model)

    @property
    def served(self) -> str:
        return self.name or self.dir.name


def parse_specs(models: list[str], names: list[str] | None, default_workers: int) -> list[ModelSpec]:
    """``--model`` values (and ``--served-model-name``s) -> ModelSpecs; ValueError with the reason."""
    names = names or []
    if names and len(names) != len(models):
        raise ValueError(f"--served-model-name is given {len(names)} times for {len(models)} --model: give it once "
                         "per --model, in the same order, or not at all")
    specs = []
    for i, text in enumerate(models):
        source, colon, count = text.rpartition(":")
        if not (colon and count.isdigit() and source and not Path(text).exists()):
            source, count = text, ""
        workers = int(count) if count else default_workers
        if workers < 1:
            raise ValueError(f"--model {text}: the worker count must be >= 1")
        specs.append(ModelSpec(source, workers, names[i] if names else None))
    return specs


def check_names(specs: list[ModelSpec]) -> str | None:
    """Once resolved: two models with one served name cannot be told apart. None when fine."""
    seen: dict[str, str] = {}
    for s in specs:
        if s.served in seen:
            return (f"--model {seen[s.served]} and --model {s.source} are both served as {s.served!r}; give each "
                    "its own --served-model-name")
        seen[s.served] = s.source
    return None


def check_aliases(aliases, served: list[str]) -> str | None:
    """Every alias target and shadow reference is served by this stack; None when so."""
    for a in aliases:
        wanted = [m for m, _ in a.targets] + ([a.shadow.reference] if a.shadow else [])
        missing = [m for m in wanted if m not in served]
        if missing:
            return (f"alias {a.name!r} names {', '.join(missing)}, which no --model serves here "
                    f"(served: {', '.join(served)})")
    return None


def gateway_model_args(args) -> list[str]:
    """The gateway's alias and shadow flags, as ``up`` was given them. Every pool of this stack shares
    one machine, so shadow comparisons give way to every client request (``--shadow-yield all``;
    a ``--gateway-arg`` given later overrides it)."""
    out = [f"--alias={a}" for a in args.alias]
    if args.models_config:
        out += ["--models-config", str(Path(args.models_config).resolve())]
    if args.shadow_fraction:
        out += ["--shadow-fraction", str(args.shadow_fraction)]
    return out + ["--shadow-yield", "all"] + list(args.gateway_arg)
