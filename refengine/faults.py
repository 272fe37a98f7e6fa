"""Whose fault a failure is, inside the engine: a request's (``request_failure``) or the engine's
(``EngineFault``). No torch.

A request that fails alone (its constraint could not be followed, its sampling or decode
raised) gets a ``RequestFailed`` on its own stream and the engine goes on; ``constraint``
marks the client's input (the worker answers 400). ``EngineFault`` is raised only when the
engine itself is broken: its own one-token canary request failed alone (``LLMEngine``). The
messages carry no grammar-library internals (``grammar.tidy``).
"""

from __future__ import annotations

from refengine.outputs import RequestFailed
from refengine.structured.grammar import GrammarError, tidy


class EngineFault(RuntimeError):
    """The engine itself is broken (its own canary request failed alone); raised from ``step``."""


def request_failure(exc: BaseException) -> RequestFailed:
    """One request's failure, as its stream reports it: a constraint that could not be followed is the
    client's input (``constraint``); anything else is an engine error on that request alone."""
    if isinstance(exc, GrammarError):
        return RequestFailed(f"the output constraint could not be followed: {tidy(str(exc))}", constraint=True)
    return RequestFailed(f"the engine failed on this request: {type(exc).__name__}: {tidy(str(exc))}")
