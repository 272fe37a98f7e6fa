"""Lower CPU priority for side work that competes with the engine: ``background_priority``.

Why: the engine's OpenMP threads take every core, and a thread that preempts one of them makes
the others wait for it at every parallel region (a thread beside the forward pass made a
decode step ~8x slower, ``refengine/structured/masks.py``). Work that answers one request and
can be slow without harm (compiling a request's constraint to check it, tokenising a
multi-megabyte prompt, compiling a grammar in the engine's side thread) runs at a nice value of
``BACKGROUND_NICE``, so that when more threads want the cores than there are, the scheduler
gives them to the engine first. (Alone on the 2-core machine, one spinning process beside a
decode-like step barely moved it at either priority: ``studies/nice_contention.py``.)

Linux sets a nice value per thread (``setpriority(PRIO_PROCESS, tid)``): ``background_priority()``
lowers the calling thread only (use it as a thread pool's ``initializer``, or at the start of a
child process, whose later threads inherit it). Raising a priority back needs privileges, so
it is never done; where the call is refused or missing (other systems) nothing changes.
"""

from __future__ import annotations

import os
import threading

BACKGROUND_NICE = 10


def background_priority() -> None:
    """Lower the calling thread's CPU priority to nice ``BACKGROUND_NICE`` (no-op where unsupported)."""
    try:
        tid = threading.get_native_id()
        now = os.getpriority(os.PRIO_PROCESS, tid)
        if now < BACKGROUND_NICE:
            os.setpriority(os.PRIO_PROCESS, tid, BACKGROUND_NICE)
    except (AttributeError, OSError):
        pass


def lower_priority_of(pid: int) -> None:
    """Lower the main thread of child process ``pid`` to ``BACKGROUND_NICE`` from its parent, right after
    starting it, so that its start (imports, tokenizer) already runs at background priority (no-op where
    unsupported)."""
    try:
        if os.getpriority(os.PRIO_PROCESS, pid) < BACKGROUND_NICE:
            os.setpriority(os.PRIO_PROCESS, pid, BACKGROUND_NICE)
    except (AttributeError, OSError):
        pass
