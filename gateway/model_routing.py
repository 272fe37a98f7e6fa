"""Which served model and which workers a request goes to: ``ModelRouter.route(...) -> Routed``.

Called by the app once a request's body has passed the edge checks (gateway.edge):

* an **alias** (gateway.aliases) picks one of its targets by weight, sticky per split key
  (the session header, else the body's ``user``), among the targets a routable worker
  serves; the body's ``model`` is rewritten to the chosen variant (the worker then answers
  with that name, so the response's ``model`` says which variant answered) and the split
  is counted per alias and variant. No target served: 503.
* a **served model**'s name goes to its pool as it is.
* an **unknown** name is a 404 (``model_not_found``) naming the served models and aliases,
  after one immediate refresh of the workers' model lists (gateway.pools.ModelDirectory.ensure);
  a name that only unavailable workers listed, or any name while some worker's list is still
  unknown (it has never answered), is a 503 (``no_worker``, Retry-After): it may be back soon.
* ``/tokenize`` and ``/detokenize`` without ``model`` (optional there, as in vLLM) go to any
  worker while one model is served; with several, ``model`` is required (400): their
  tokenizers may differ.

The ``model`` label of the request's metrics is bound here (gateway.metrics.bind_model), to
the served model only, so its values stay bounded to what the workers list.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import orjson

from gateway.aliases import Alias, AliasTable, pick


class ModelError(Exception):
    """A request for a model the gateway cannot route: status, OpenAI error type and code."""

    def __init__(self, status: int, message: str, type_: str, code: str, param: str | None = "model") -> None:
        super().__init__(message)
        self.status, self.type, self.code, self.param = status, type_, code, param


@dataclass
class Routed:
    model: str | None        # the served model (None: a tokenizer request without one, a single pool)
    alias: Alias | None      # the alias the client named, if it named one
    pool: object             # the workers it may use: a gateway.pools.ModelPool, or every worker
    body: dict               # the body to send (``model`` rewritten to the variant for an alias)
    raw: bytes


def split_key(headers, body: dict, session_header: str) -> str | None:
    """What keeps a client on one variant: the session header, else the body's ``user``."""
    key = headers.get(session_header) if session_header else None
    if not key and isinstance(body.get("user"), str):
        key = body["user"]
    return key or None


class ModelRouter:
    def __init__(self, directory, aliases: AliasTable, metrics, session_header: str,
                 rng: random.Random | None = None) -> None:
        self.directory, self.aliases, self.metrics = directory, aliases, metrics
        self.session_header, self.rng = session_header, rng or random.Random()

    def listing(self, now: float) -> list[dict]:
        """``/v1/models``: each served model once, then the aliases with a served target."""
        cards = self.directory.cards(now)
        served = {c.get("id") for c in cards}
        created = int(time.time())
        for a in self.aliases:
            if a.name not in served and any(m in served for m, _ in a.targets):
                cards.append({"id": a.name, "object": "model", "created": created, "owned_by": "swiftserve",
                              "root": a.targets[0][0], "parent": None,
                              "targets": {m: round(w, 6) for m, w in a.weights.items()}})
        return cards

    def _names(self) -> str:
        served = self.directory.served(time.monotonic())
        aliases = [a.name for a in self.aliases if a.name not in served]
        text = ", ".join(served) or "none at the moment"
        return text + (f"; aliases: {', '.join(aliases)}" if aliases else "")

    async def route(self, client, path: str, body: dict, raw: bytes, headers) -> Routed:
        name = body.get("model")
        if name is None:                        # /tokenize, /detokenize: optional there
            served = self.directory.served(time.monotonic())
            if len(served) > 1:
                raise ModelError(400, f"This gateway serves several models ({', '.join(served)}): name one in "
                                      "'model'.", "invalid_request_error", "model_required")
            return Routed(None, None, self.directory.pool, body, raw)
        alias = self.aliases.get(name)
        if alias is not None:
            return await self._split(client, alias, body, raw, headers)
        if not await self.directory.ensure(client, name):
            if name in self.directory.known() or self.directory.unknown():
                raise ModelError(503, f"No worker serving `{name}` is available at the moment.",
                                 "service_unavailable", "no_worker")
            raise ModelError(404, f"The model `{name}` does not exist. Served here: {self._names()}.",
                             "invalid_request_error", "model_not_found")
        self.metrics.bind_model(name)
        return Routed(name, None, self.directory.of(name), body, raw)

    async def _split(self, client, alias: Alias, body: dict, raw: bytes, headers) -> Routed:
        now = time.monotonic()
        available = set(self.directory.served(now))
        if not any(m in available for m, _ in alias.targets):
            await self.directory.ensure(client, alias.targets[0][0])
            available = set(self.directory.served(time.monotonic()))
        model = pick(alias, split_key(headers, body, self.session_header), available, self.rng)
        if model is None:
            raise ModelError(503, f"No worker serves a model of `{alias.name}` "
                                  f"({', '.join(m for m, _ in alias.targets)}) at the moment.",
                             "service_unavailable", "no_worker")
        self.metrics.bind_model(model)
        self.metrics.split.labels(alias.name, model).inc()
        if body.get("model") != model:
            body = {**body, "model": model}
            raw = orjson.dumps(body)
        return Routed(model, alias, self.directory.of(model), body, raw)
