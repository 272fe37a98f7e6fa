"""``gc_paused()``: no cyclic garbage collection while a request body is parsed.

Why: parsing a JSON body of many small objects (40,000 tools are 80,000 dicts) allocates
enough containers to trigger several collections, and in a process whose heap already holds
hundreds of thousands of objects (a worker imports torch and transformers) each collection of
the older generations walks all of them: a 40,000-tool body took 210 ms to parse there instead
of 30 ms (``studies/hostile_body_cost.py``, docs/reliability.md), all of it on the event
loop. A freshly parsed body holds no reference cycles, so nothing is lost by collecting later:
collection resumes when the block ends (the objects still count towards its thresholds), and
a body refused at once is freed by reference counting before any collection runs.

Nesting is safe; where the collector was already disabled it stays so.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def gc_paused() -> Iterator[None]:
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
