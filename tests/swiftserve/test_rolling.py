"""swiftserve.rolling with real short-lived processes: SIGHUP's rolling restart stops and starts
the workers one at a time, waits for each to be healthy and routed again, and the supervisor
does not restart a worker that the rolling restart holds."""

import sys
import time

from swiftserve.rolling import RollingRestart
from swiftserve.supervisor import Supervisor
import pytest

pytestmark = pytest.mark.e2e

# Exits 0 a moment after SIGTERM, like a worker that drains.
DRAINS = [sys.executable, "-c", "import signal, sys, time; "
          "signal.signal(signal.SIGTERM, lambda *a: (time.sleep(0.2), sys.exit(0))); time.sleep(60)"]


def test_workers_restart_one_at_a_time_and_come_back():
    said = []
    sup = Supervisor(say=said.append)
    workers = [sup.start(f"worker {i}", DRAINS) for i in range(3)]
    urls = {f"http://w{i}": w for i, w in enumerate(workers)}
    first_pids = [w.proc.pid for w in workers]
    healthy = lambda url: urls[url].running          # noqa: E731 - a worker is healthy while its process runs
    ready = lambda: all(w.running for w in workers)  # noqa: E731
    roll = RollingRestart(sup, [(w, u) for u, w in urls.items()], ready, healthy, exit_timeout=10, health_timeout=10)
    deadline = time.monotonic() + 30
    try:
        while not roll.done:
            assert time.monotonic() < deadline, said
            roll.step()
            sup.poll()                                   # a held worker's exit must not trigger a restart
            assert sum(not w.running for w in workers) <= 1
            time.sleep(0.02)
        assert roll.restarted == ["worker 0", "worker 1", "worker 2"]
        assert all(w.running and not w.held for w in workers)
        assert all(w.proc.pid != pid for w, pid in zip(workers, first_pids))
        assert all(w.total_restarts == 0 for w in workers)        # planned: not counted as crashes
        assert not any("restarting in" in line for line in said)
    finally:
        sup.stop(grace=5)
