"""The one protocol every API's stream tracker follows, and the one function that feeds it a worker's events.

Owns: ``ResumableStream`` (the small ABC gateway.failover relies on; one subclass per API:
gateway.migration.completions for completions and chat, gateway.migration.responses for
``/v1/responses``), ``Migrate`` (a failure another worker can resume from), ``rewrite``
(complete SSE events from a worker -> the bytes the client gets) and the constants both APIs
share with the worker (``CONTINUATION_HEADER``, ``RETRYABLE_CODES``).

Invariants a tracker keeps (gateway.failover counts on them):

* ``upstream()`` is the first worker's body, ``resume()`` the next worker's (the client's request
  asking for token ids, with ``continuation_token_ids`` = every id the client has been sent);
  the second value of ``resume()`` is the number of ids the worker must confirm (0: a plain re-run).
* ``event(data)`` sees every ``data:`` object in order; what it returns is all the client gets of it.
* ``can_migrate()`` is true only while resuming can neither repeat nor lose what the client has.
* ``ended`` turns true once the client has the stream's last event (the worker's ``[DONE]``, or the
  API's own terminal event); ``finished`` once nothing is left to generate.
* ``legs()``: None for a stream that resumes whole; a list for one that resumes as parts
  (completions' n > 1), then ``summed_usage(legs)`` is what ends it before ``[DONE]``.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod

import orjson

from gateway.streaming import DONE

CONTINUATION_HEADER = "x-swiftserve-continuation"       # worker.continuation
# In-band worker errors that say the worker or its engine failed, not the request.
RETRYABLE_CODES = frozenset({"engine_error", "engine_unavailable", "shutting_down"})


class Migrate(Exception):
    """The worker failed after the first byte in a way another worker can resume from."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def worker_failed(err) -> Migrate | None:
    """An in-band error object -> a Migrate when its code (``RETRYABLE_CODES``) says the worker or its engine
    failed, not the request; else None (the error is the client's answer)."""
    if isinstance(err, dict) and err.get("code") in RETRYABLE_CODES:
        return Migrate("worker_error", f"the worker reported {err.get('code')}: {err.get('message')}")
    return None


class ResumableStream(ABC):
    """What one migratable stream has sent to the client; builds the bodies sent upstream."""

    def __init__(self, body: dict, max_migrations: int) -> None:
        self.body, self.max_migrations = body, max_migrations
        self.want_ids = body.get("return_token_ids") is True       # the client asked for them too
        self.migrations = 0              # counted by gateway.failover
        self.ended = False               # the client has the stream's last event

    def upstream(self) -> bytes:
        """The first worker's body: the client's, asking for token ids."""
        return orjson.dumps({**self.body, "return_token_ids": True})

    def _resumed(self, body: dict, token_ids: list[int]) -> tuple[bytes, int]:
        body = {**body, "return_token_ids": True}
        if token_ids:
            body["continuation_token_ids"] = token_ids
        return orjson.dumps(body), len(token_ids)

    @property
    @abstractmethod
    def finished(self) -> bool:
        """Nothing is left to generate: a failure now only ends the stream."""

    @abstractmethod
    def resume(self) -> tuple[bytes, int]:
        """The next worker's body, and how many continuation tokens it must confirm."""

    @abstractmethod
    def can_migrate(self) -> bool:
        """Whether another worker may take over now."""

    @abstractmethod
    def event(self, data: dict) -> tuple[dict | None, Migrate | None]:
        """One parsed ``data:`` object -> (what the client gets, or None; a Migrate to act on after it)."""

    def done(self) -> bytes:
        """The worker's ``[DONE]``: the stream has ended; what the client gets of it."""
        self.ended = True
        return DONE

    def legs(self) -> list[ResumableStream] | None:
        """The parts the stream resumes as, each on its own; None: it resumes whole."""
        return None

    def summed_usage(self, legs: list[ResumableStream]) -> bytes:
        """What ends a stream resumed as ``legs`` once they are over, before its ``[DONE]``."""
        return b""


def _py_dumps(obj) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def rewrite(tracker: ResumableStream, events: bytes) -> tuple[bytes, Migrate | None, bool]:
    """Complete SSE events from a worker -> (bytes for the client, a Migrate to act on, the stream ended).

    Events after a Migrate are dropped (the next worker regenerates them). A ``data:`` line that is
    not JSON raises ``ValueError``."""
    out = []
    for block in events.replace(b"\r\n", b"\n").split(b"\n\n"):
        if not block.strip():
            continue
        lines = block.split(b"\n")
        data = [ln[5:].strip() for ln in lines if ln.startswith(b"data:")]
        if len(data) != 1:
            out.append(block + b"\n\n")          # comments, or several data lines: passed as they are
            continue
        if data[0] == b"[DONE]":
            out.append(tracker.done())
            continue
        try:
            obj, dumps = orjson.loads(data[0]), orjson.dumps
        except orjson.JSONDecodeError:           # what orjson refuses but Python emits (-Infinity logprobs)
            obj, dumps = json.loads(data[0]), _py_dumps
        if not isinstance(obj, dict):
            raise ValueError("an event that is not a JSON object")
        obj, migrate = tracker.event(obj)
        if obj is not None:
            head = [ln + b"\n" for ln in lines if ln.startswith(b"event:")][:1]     # Responses' event names
            out.append(b"".join(head) + b"data: " + dumps(obj) + b"\n\n")
        if migrate is not None:
            return b"".join(out), migrate, False
    return b"".join(out), None, tracker.ended
