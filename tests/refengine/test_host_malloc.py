"""refengine.host_malloc: after tune_malloc() a freed 24 MiB block stays in glibc's heap (served
without mmap, kept after free), and the engine applies it on CPU unless told not to."""

import ctypes

import pytest

from refengine.host_malloc import anon_huge_mib, spawn_environment, tune_malloc, with_hugepage_tunable

pytestmark = pytest.mark.e2e


class Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                 "fsmblks", "uordblks", "fordblks", "keepcost")]


def glibc():
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = Mallinfo2
        libc.malloc.restype = ctypes.c_void_p
        libc.malloc.argtypes = [ctypes.c_size_t]
        libc.free.argtypes = [ctypes.c_void_p]
        return libc
    except (OSError, AttributeError):
        return None


@pytest.mark.skipif(glibc() is None, reason="not glibc >= 2.33")
def test_freed_activation_sized_blocks_stay_in_the_heap():
    libc = glibc()
    assert tune_malloc() and tune_malloc()                  # idempotent
    size = 24 << 20
    before = libc.mallinfo2()
    p = libc.malloc(size)
    assert p
    during = libc.mallinfo2()
    assert during.hblkhd - before.hblkhd < size             # not a fresh mapping
    libc.free(p)
    after = libc.mallinfo2()
    assert after.fordblks >= size                            # kept for the next step, not trimmed


@pytest.mark.model
def test_engine_applies_it_unless_disabled(smollm2_dir):
    from refengine.config import EngineConfig
    from refengine.engine import LLMEngine

    for on in (False, True):
        eng = LLMEngine(EngineConfig(model=str(smollm2_dir), max_model_len=128, kv_cache_memory_gb=0.02,
                                     malloc_tuning=on))
        assert eng.runner.malloc_tuned is (on and glibc() is not None)


def test_hugepage_tunable_is_added_once_and_keeps_the_users_settings():
    assert with_hugepage_tunable(None) == "glibc.malloc.hugetlb=1"
    assert with_hugepage_tunable("glibc.malloc.arena_max=2") == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    assert with_hugepage_tunable("glibc.malloc.hugetlb=0") == "glibc.malloc.hugetlb=0"     # the user's choice wins


CHILD = """
import ctypes, os
from refengine.host_malloc import anon_huge_mib
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
n = 64 << 20
p = libc.malloc(n)
ctypes.memset(p, 1, n)                       # fault the pages in
print(os.environ.get("GLIBC_TUNABLES"), anon_huge_mib())
"""


def thp_mode() -> str:
    try:
        text = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return "unknown"
    return text[text.index("[") + 1:text.index("]")]


@pytest.mark.parametrize("on", [False, True])
def test_a_process_spawned_inside_gets_huge_pages(on, monkeypatch):
    import os
    import platform
    import subprocess
    import sys

    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=4")
    with spawn_environment(on):
        out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True).stdout.split()
    assert os.environ["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=4"          # restored for later children
    assert out[0] == ("glibc.malloc.arena_max=4:glibc.malloc.hugetlb=1" if on else "glibc.malloc.arena_max=4")
    libc, version = platform.libc_ver()
    tunable_known = libc == "glibc" and tuple(map(int, version.split("."))) >= (2, 35)
    if out[1] != "None" and thp_mode() == "madvise" and tunable_known:
        # THP only where asked (mode "madvise"): the 64 MiB block gets huge pages with the tunable
        assert (float(out[1]) >= 2) is on


def test_anon_huge_mib_reads_smaps_rollup(tmp_path):
    f = tmp_path / "smaps_rollup"
    f.write_text("Rss:  1000 kB\nAnonHugePages:  4096 kB\n")
    assert anon_huge_mib(f) == 4.0
    assert anon_huge_mib(tmp_path / "missing") is None
