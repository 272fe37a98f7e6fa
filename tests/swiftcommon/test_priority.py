"""``background_priority`` lowers the calling thread only (Linux: a nice value per thread)."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from swiftcommon.priority import BACKGROUND_NICE, background_priority


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="no per-thread priorities here")
def test_a_pool_thread_runs_at_background_priority_and_the_caller_keeps_its_own():
    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    with ThreadPoolExecutor(max_workers=1, initializer=background_priority) as pool:
        tid = pool.submit(threading.get_native_id).result()
        assert pool.submit(os.getpriority, os.PRIO_PROCESS, tid).result() == max(before, BACKGROUND_NICE)
        pool.submit(background_priority).result()             # again: no change, no error
        assert os.getpriority(os.PRIO_PROCESS, tid) == max(before, BACKGROUND_NICE)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before
