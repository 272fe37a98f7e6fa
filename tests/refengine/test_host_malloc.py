"""refengine.host_malloc: after tune_malloc() a freed 24 MiB block stays in glibc's heap (served
without mmap, kept after free), and the engine applies it on CPU unless told not to."""

import ctypes

import pytest

from refengine.host_malloc import tune_malloc


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
