"""Public model names and weighted splits: ``--alias`` flags and a ``--models-config`` file (reloaded on change).

An *alias* maps the name a client sends to one or more served models with weights, e.g.
``smollm2 -> SmolLM2-135M-Instruct: 90, SmolLM2-135M-Instruct-SwiftKV: 10`` (a canary). An
alias may carry a served model's own name, so that clients keep sending the original's name
while part of its traffic goes to a variant. Targets always name served models (an alias is
never resolved twice). Optionally an alias has a *shadow* spec (gateway.shadow): which target
is the original (``reference``), which targets are scored against it (``models``) and on what
fraction of their requests.

Flags: ``--alias NAME=MODEL[:WEIGHT][,MODEL[:WEIGHT]...]`` (weight 1 when left out; with
``--shadow-fraction F`` > 0 the first target is the reference and the others are shadowed).
File (YAML or JSON; re-read within ``interval`` seconds of a change, no restart; a file that
does not parse or validate is refused with one log line and the previous table stays)::

    aliases:
      smollm2:
        targets: {SmolLM2-135M-Instruct: 90, SmolLM2-135M-Instruct-SwiftKV: 10}
        shadow: {reference: SmolLM2-135M-Instruct, fraction: 0.2}     # optional; models: [...]

File entries replace flag entries of the same name.

Stickiness (``pick``): a request with a split key (the session header, else the body's
``user``) goes where the key hashes to: the key's point ``u`` in [0, 1) (blake2b of alias and
key, the same in every gateway replica) falls into one target's share of the cumulative
weights, so a conversation stays on one variant, and changing 90/10 to 80/20 moves only the
keys between 0.8 and 0.9. A target without a routable worker is skipped: the key is re-hashed
over the targets that have one (the keys of available targets do not move). Without a key the
point is random.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass
from hashlib import blake2b
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShadowSpec:
    reference: str                 # the original: scores the others' answers
    fraction: float                # share of a shadowed model's requests that are scored
    models: tuple[str, ...]        # the targets whose answers are scored (the reference too, as a control)


@dataclass(frozen=True)
class Alias:
    name: str
    targets: tuple[tuple[str, float], ...]      # (served model, weight > 0), in configured order
    shadow: ShadowSpec | None = None

    @property
    def weights(self) -> dict[str, float]:
        total = sum(w for _, w in self.targets)
        return {m: w / total for m, w in self.targets}


def _unit(*parts: str) -> float:
    """A stable point in [0, 1) for ``parts`` (same in every process)."""
    digest = blake2b("\x00".join(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0 ** 64


def _cumulative(targets, u: float) -> str:
    total = sum(w for _, w in targets)
    acc = 0.0
    for model, w in targets:
        acc += w / total
        if u < acc:
            return model
    return targets[-1][0]


def pick(alias: Alias, key: str | None, available, rng: random.Random) -> str | None:
    """The served model this request goes to (None when no target is ``available``)."""
    u = _unit(alias.name, key) if key else rng.random()
    model = _cumulative(alias.targets, u)
    if model in available:
        return model
    rest = [(m, w) for m, w in alias.targets if m in available]
    if not rest:
        return None
    return _cumulative(rest, _unit(alias.name, "fallback", key) if key else rng.random())


def build_alias(name: str, targets, shadow: dict | None = None, default_fraction: float = 0.0) -> Alias:
    """An ``Alias`` from plain values (checked): ``targets`` is {model: weight} or [(model, weight)]."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError("an alias needs a non-empty name")
    items = list(targets.items()) if isinstance(targets, dict) else list(targets or ())
    if not items:
        raise ValueError(f"alias {name!r}: no target models")
    out = []
    for model, weight in items:
        if not isinstance(model, str) or not model.strip():
            raise ValueError(f"alias {name!r}: a target model name is empty")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight >= 0 or weight == float("inf"):
            raise ValueError(f"alias {name!r}: the weight of {model!r} must be a number >= 0, not {weight!r}")
        out.append((model.strip(), float(weight)))
    if len({m for m, _ in out}) != len(out):
        raise ValueError(f"alias {name!r}: a target is listed twice")
    if not sum(w for _, w in out) > 0:
        raise ValueError(f"alias {name!r}: the weights add up to 0")
    out = [(m, w) for m, w in out if w > 0]
    return Alias(name.strip(), tuple(out), _shadow(name, out, shadow, default_fraction))


def _shadow(name: str, targets, spec: dict | None, default_fraction: float) -> ShadowSpec | None:
    if spec is None:
        if default_fraction <= 0 or len(targets) < 2:
            return None
        spec = {}
    if not isinstance(spec, dict):
        raise ValueError(f"alias {name!r}: shadow must be a mapping (reference, fraction, models)")
    unknown = set(spec) - {"reference", "fraction", "models"}
    if unknown:
        raise ValueError(f"alias {name!r}: unknown shadow keys {sorted(unknown)}")
    names = [m for m, _ in targets]
    reference = spec.get("reference", names[0])
    if not isinstance(reference, str) or not reference:
        raise ValueError(f"alias {name!r}: shadow.reference must be a model name")
    if "fraction" not in spec and default_fraction <= 0:
        raise ValueError(f"alias {name!r}: give shadow.fraction (or --shadow-fraction)")
    fraction = spec.get("fraction", default_fraction)
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction <= 1:
        raise ValueError(f"alias {name!r}: shadow.fraction must be between 0 and 1, not {fraction!r}")
    models = spec.get("models", [m for m in names if m != reference])
    if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
        raise ValueError(f"alias {name!r}: shadow.models must be a list of model names")
    stray = [m for m in models if m not in names]
    if stray:
        raise ValueError(f"alias {name!r}: shadow.models {stray} are not targets of the alias")
    return ShadowSpec(reference, float(fraction), tuple(models)) if models and fraction > 0 else None


def parse_alias_flag(text: str, default_fraction: float = 0.0) -> Alias:
    """``NAME=MODEL[:WEIGHT][,MODEL[:WEIGHT]...]`` -> Alias (ValueError with the reason)."""
    name, sep, rest = text.partition("=")
    if not sep:
        raise ValueError(f"--alias {text!r}: expected NAME=MODEL[:WEIGHT][,MODEL[:WEIGHT]...]")
    targets = []
    for part in (p.strip() for p in rest.split(",")):
        if not part:
            continue
        model, colon, weight = part.rpartition(":")
        if not colon:
            model, weight = part, "1"
        try:
            targets.append((model, float(weight)))
        except ValueError:
            raise ValueError(f"--alias {text!r}: weight {weight!r} of {model!r} is not a number") from None
    return build_alias(name, targets, None, default_fraction)


def read_aliases(path: str | Path, default_fraction: float = 0.0) -> dict[str, Alias]:
    """The ``aliases`` of a YAML/JSON file (ValueError / OSError with the reason)."""
    import yaml

    try:
        doc = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not YAML/JSON: {exc}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict) or not isinstance(doc.get("aliases", {}), dict) or set(doc) - {"aliases"}:
        raise ValueError(f"{path}: expected a mapping with one key, 'aliases' (name -> {{targets, shadow}})")
    out = {}
    for name, entry in (doc.get("aliases") or {}).items():
        if not isinstance(entry, dict) or set(entry) - {"targets", "shadow"}:
            raise ValueError(f"{path}: alias {name!r} must be a mapping with 'targets' (and optionally 'shadow')")
        out[str(name)] = build_alias(str(name), entry.get("targets"), entry.get("shadow"), default_fraction)
    return out


class AliasTable:
    """The aliases in force: the flags' and, on top, the file's (``reload`` re-reads the file)."""

    def __init__(self, static: list[Alias] = (), path: str | None = None, default_fraction: float = 0.0) -> None:
        self.static = {a.name: a for a in static}
        self.path, self.default_fraction = path, default_fraction
        self.table = dict(self.static)
        self._mtime = None
        if path:
            self.table = {**self.static, **read_aliases(path, default_fraction)}     # a bad file stops start-up
            self._mtime = Path(path).stat().st_mtime_ns

    def get(self, name) -> Alias | None:
        return self.table.get(name) if isinstance(name, str) else None

    def __iter__(self):
        return iter(list(self.table.values()))

    def reload(self) -> bool:
        """Re-read the file if it changed; True when the table changed. A bad file keeps the old table."""
        try:
            mtime = Path(self.path).stat().st_mtime_ns
            if mtime == self._mtime:
                return False
            self._mtime = mtime
            table = {**self.static, **read_aliases(self.path, self.default_fraction)}
        except (OSError, ValueError) as exc:
            log.error("models config %s refused, keeping the previous aliases: %s", self.path, exc)
            return False
        changed = table != self.table
        self.table = table
        if changed:
            log.info("models config %s reloaded: %s", self.path, "; ".join(
                f"{a.name} -> " + ", ".join(f"{m} {w:g}" for m, w in a.targets) for a in table.values()) or "no aliases")
        return changed

    async def watch(self, interval: float = 2.0) -> None:
        while True:
            await asyncio.sleep(interval)
            self.reload()
