"""Request bodies as JSON, parsed once and fast: the one JSON reader of the gateway and the worker.

``parse_json(raw, big_ints=...)`` reads a document with orjson where orjson reads it as the json
module would, and with the json module where orjson refuses it (NaN, infinities, nesting deeper
than 1024, lone surrogate escapes, bad JSON: the json module's ValueError / RecursionError then).
The cyclic garbage collector is paused meanwhile (``swiftcommon.gc_pause``: collections triggered
by a body of many small objects cost several times the parse in a large heap).

The two readers differ in one thing, integers beyond 64 bits, which orjson reads as floats:
- ``big_ints="float"`` (the gateway): as orjson does, also where the json module had to read the
  document; the gateway writes bodies again with orjson when it forwards them, and orjson cannot
  write a larger int;
- ``big_ints="exact"`` (the worker): as the json module does (Python ints): a run of 19 digits,
  which such an integer needs, sends the document to the json module (finding out costs about
  1.5 ms per MB), so validation sees the number the client wrote.

``json_text(value)``: compact JSON text of a parsed part (estimates and hashes of tools, tool
calls), orjson's where it can.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import orjson

from swiftcommon.gc_pause import gc_paused

# Every digit -> "0", every other byte -> " ": a run of 19 zeros in the translation is a run of 19 digits.
_DIGITS = bytes(0x30 if 0x30 <= i <= 0x39 else 0x20 for i in range(256))
_LONG = b"0" * 19


def _int_as_orjson(text: str) -> int | float:
    """An integer as orjson reads one: beyond 64 bits, a float."""
    v = int(text)
    return v if -(1 << 63) <= v < (1 << 64) else float(text)


def parse_json(raw: bytes, big_ints: Literal["float", "exact"]) -> Any:
    """The document in ``raw``; raises ValueError (bad JSON or UTF-8) or RecursionError (nesting)."""
    with gc_paused():
        if big_ints == "float" or _LONG not in raw.translate(_DIGITS):
            try:
                return orjson.loads(raw)
            except orjson.JSONDecodeError:
                pass
        return json.loads(raw, parse_int=_int_as_orjson if big_ints == "float" else None)


def json_text(value, sort_keys: bool = False) -> str:
    """``value`` as compact JSON text: orjson's (a tenth of the json module's time: 4 ms for 40,000
    tools), the json module's where orjson refuses (an integer beyond 64 bits, a lone surrogate).
    Raises ValueError / RecursionError as json.dumps does."""
    try:
        return orjson.dumps(value, default=str, option=orjson.OPT_SORT_KEYS if sort_keys else 0).decode()
    except TypeError:
        return json.dumps(value, default=str, sort_keys=sort_keys, separators=(",", ":"), ensure_ascii=False)
