"""Output constraints compiled at the edge, off the event loop: ``ConstraintChecker``.

Every constraint of a request (a ``StructuredSpec``: ``response_format`` / ``structured_outputs``
/ ``guided_*``, each tool's parameters schema, the schema of tool_choice "required" or of a
named tool) is compiled against the model's tokenizer and its first token mask computed
before the request is admitted (``refengine.structured.grammar.compile_check``: the library,
parser limits and tokenizer the engine uses), so the engine never sees a constraint that did
not compile. ``check(items, timeout)`` answers for all of a request's constraints together
within ``timeout`` seconds (``--constraint-timeout``); the first that fails raises
``ConstraintError`` naming its field and the reason, with no library internals.

Where: child processes (``python -m worker.constraints``, each a ``worker.child_process.LineChild``),
at most ``PROCESSES``, each compiling one constraint at a time, at a lower CPU priority
(``swiftcommon.priority``); the event loop only writes a line and awaits the answer. Children
start on first use.
A compile that runs past the time left is stopped by killing its child, which is started
again in the background (a child that crashes is replaced the same way). A child needs
neither torch nor the model: llguidance and the tokenizer (handed over as its
``tokenizer.json`` text), about a second to start. Answers (good and bad) are kept in an LRU
cache keyed by the spec (at most ``CACHE_ENTRIES`` entries and ``CACHE_BYTES`` of spec text),
so a schema sent again is answered at once.

Child protocol (JSON lines): the child prints ``"ready"`` once its tokenizer is built; then
for each ``{"kind", "text", "ws"}`` it reads, it prints ``{"error": null | "message"}``.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import sys
import tempfile
import time

from refengine.structured.grammar import GrammarError, check, compile_check, tidy
from refengine.structured.spec import StructuredSpec
from swiftcommon.priority import background_priority
from worker.child_process import ChildFailed, LineChild

log = logging.getLogger(__name__)

PROCESSES = 2               # children compiling at once (the second starts only when two checks overlap)
CACHE_ENTRIES = 512
CACHE_BYTES = 16 << 20


class ConstraintError(Exception):
    """A request's constraint cannot be used: ``param`` names the field, the message says why."""

    def __init__(self, param: str, reason: str) -> None:
        super().__init__(reason)
        self.param, self.reason = param, reason


class _Child(LineChild):
    """One compile process; ``check`` sends one spec and waits at most ``timeout`` s for its answer."""

    async def check(self, spec: StructuredSpec, timeout: float) -> str | None:
        """None when ``spec`` compiles; else the reason. A child past ``timeout`` is killed and restarted."""
        msg = json.dumps({"kind": spec.kind, "text": spec.text, "ws": spec.whitespace_pattern}) + "\n"
        try:
            line = await self.ask(msg.encode(), timeout)
        except ChildFailed as exc:
            return "it did not compile within the time limit (--constraint-timeout)" if exc.timed_out \
                else "the grammar compiler failed on it"
        return json.loads(line)["error"]


class ConstraintChecker:
    """Compiles a request's constraints in child processes (see the module docstring). Built off the event
    loop (it writes the tokenizer's JSON for the children); the children start on first use."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: tuple[int, ...]) -> None:
        self._file = None
        argv = [sys.executable, "-m", "worker.constraints"]
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None:                 # a fast tokenizer: the children compile against it
            import copy

            backend = copy.copy(backend)
            backend.no_padding()
            backend.no_truncation()
            fd, self._file = tempfile.mkstemp(prefix="swiftserve-tokenizer-", suffix=".json")
            with os.fdopen(fd, "w") as f:
                f.write(backend.to_str())
            argv += [self._file, str(vocab_size), ",".join(map(str, eos_token_ids))]
        self._children = [_Child(argv, "constraint compiler") for _ in range(PROCESSES)]
        self._idle = list(self._children)
        self._free = asyncio.Semaphore(PROCESSES)
        self._cache: collections.OrderedDict[StructuredSpec, str | None] = collections.OrderedDict()
        self._cache_bytes = 0
        self.compiled = 0

    async def check(self, items: list[tuple[str, StructuredSpec]], timeout: float) -> None:
        """Raise ``ConstraintError`` for the first of ``items`` ((field, spec), in order) that cannot be
        used; together they get ``timeout`` seconds of compile time (a child's start-up not counted)."""
        budget = [timeout]
        for param, spec in items:
            if spec in self._cache:
                self._cache.move_to_end(spec)
                reason = self._cache[spec]
            else:
                # Shielded: a client that leaves mid-compile does not leave a child with an unread answer.
                reason = await asyncio.shield(asyncio.ensure_future(self._compile(spec, budget, timeout)))
            if reason is not None:
                raise ConstraintError(param, reason)

    async def _compile(self, spec: StructuredSpec, budget: list[float], timeout: float) -> str | None:
        await self._free.acquire()
        # A running child first, then one that is starting, then one to start.
        child = min(self._idle, key=lambda c: 0 if c.proc is not None else 1 if c.starting is not None else 2)
        self._idle.remove(child)
        try:
            try:
                await child.ready()
            except Exception as exc:  # noqa: BLE001 - no child: compile here, off the loop, without the tokenizer
                log.error("constraint compiler unavailable (%s): checking without the tokenizer", exc)
                return await asyncio.to_thread(_reason_here, spec)
            if budget[0] <= 0:           # not cached: the answer says nothing about this spec itself
                return f"the request's constraints did not compile within the time limit of {timeout:g} s " \
                       "(--constraint-timeout)"
            t0 = time.monotonic()
            reason = await child.check(spec, budget[0])
            budget[0] -= time.monotonic() - t0
        finally:
            self._idle.append(child)
            self._free.release()
        self.compiled += 1
        if budget[0] > 0 or reason is None or "time limit" not in reason:
            self._remember(spec, reason)       # a timeout on a share of the budget is not the spec's answer
        return reason

    def _remember(self, spec: StructuredSpec, reason: str | None) -> None:
        self._cache[spec] = reason
        self._cache_bytes += len(spec.text)
        while len(self._cache) > CACHE_ENTRIES or self._cache_bytes > CACHE_BYTES:
            old, _ = self._cache.popitem(last=False)
            self._cache_bytes -= len(old.text)

    def close(self) -> None:
        for child in self._children:
            if child.starting is not None:
                child.starting.cancel()
            child.kill()
        if self._file is not None:
            try:
                os.unlink(self._file)
            except OSError:
                pass


def _reason_here(spec: StructuredSpec, tokenizer=None) -> str | None:
    """Why ``spec`` cannot be used (None: it compiles), in this process."""
    try:
        compile_check(spec, tokenizer) if tokenizer is not None else check(spec)
        return None
    except GrammarError as exc:
        return str(exc)
    except Exception as exc:  # noqa: BLE001 - the library's own failure on this input
        return tidy(f"{type(exc).__name__}: {exc}")


def _serve(argv: list[str]) -> None:
    """The child: compile each spec read from stdin, answer on stdout, at background priority
    (a hostile constraint's compile must not take a core from the engine)."""
    background_priority()
    tokenizer = None
    if argv:
        import llguidance

        path, vocab, eos = argv
        with open(path) as f:
            tokenizer = llguidance.LLTokenizer(f.read(), n_vocab=int(vocab),
                                               eos_token=[int(t) for t in eos.split(",") if t])
    out = sys.stdout
    out.write('"ready"\n')
    out.flush()
    for line in sys.stdin:
        req = json.loads(line)
        error = _reason_here(StructuredSpec(req["kind"], req["text"], req["ws"]), tokenizer)
        out.write(json.dumps({"error": error}) + "\n")
        out.flush()


if __name__ == "__main__":
    _serve(sys.argv[1:])
