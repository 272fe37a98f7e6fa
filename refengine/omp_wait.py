"""How long the engine process's OpenMP threads spin at a barrier before they sleep: ``GOMP_SPINCOUNT``.

Contract: ``spawn_overrides()`` is the environment the engine process is spawned with for this
(``refengine.host_malloc.spawn_environment`` applies it): ``GOMP_SPINCOUNT=ENGINE_SPINCOUNT``,
unless the user set ``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY`` (theirs is kept). libgomp, torch's
OpenMP here, reads it once when it loads, so it must be in the environment the process starts with.

Why: the engine's intra-op threads take every core (``--torch-threads``), and at each of a decode
step's hundreds of parallel regions a thread that has finished its share spins while it waits for
the others. libgomp's default spin is 300,000 iterations. When anything else wants a core (a
request parsed beside the forward pass, a constraint compiled, another process on the host), the
thread that still has work is descheduled while its partner spins on the other core, and every
region waits for a scheduler slice: on the 2-core machine, one busy process beside the engine made
an 8-token chat through the stack ~46x slower (87 ms -> 4.0 s median, the busy process at nice 0 or
10 alike); a short spin sleeps instead and gives the core back. Measured
(``PYTHONPATH=$PWD python -m studies.omp_spin --out results/reliability/omp_spin.json``: 15 chats of
8 tokens through ``swiftserve up``, one at a time, median ms, alone / beside one spinning process at
nice 0 / at nice 10; alone figures move +-6 ms from run to run):

| GOMP_SPINCOUNT | alone | beside nice 0 | beside nice 10 |
|---|---:|---:|---:|
| 300,000 (libgomp's default) | 87.0 | 4019.6 | 4619.8 |
| 100,000 | 83.7 | 3953.2 | 3414.3 |
| 20,000 | 84.3 | 1173.1 | 1189.4 |
| 5,000 | 73.6 | 421.1 | 414.4 |
| **2,000** | **85.5** | **240.7** | **235.7** |
| 1,000 | 85.2 | 174.3 | 169.9 |
| 300 | 115.3 | 134.7 | 133.2 |
| 100 | 126.1 | 125.5 | 126.0 |
| OMP_WAIT_POLICY=PASSIVE | 129.6 | 119.1 | 119.0 |

Below ~1,000 a waiting thread sleeps before a fast partner finishes and pays a futex wake at every
region (1.5x slower alone); 2,000 costs nothing measurable alone (an earlier run of the same
procedure: 79.4 ms alone, 80.4 unset) and keeps the engine within 3x of alone beside a busy core.
Iterations, not time: a much faster or slower core moves the knee.
"""

from __future__ import annotations

from swiftcommon import envs

ENGINE_SPINCOUNT = 2000


def spawn_overrides() -> dict[str, str]:
    """The engine process's OpenMP wait settings to add to its environment (none where the user set theirs)."""
    if envs.gomp_spincount() is not None or envs.omp_wait_policy() is not None:
        return {}
    return {"GOMP_SPINCOUNT": str(ENGINE_SPINCOUNT)}
