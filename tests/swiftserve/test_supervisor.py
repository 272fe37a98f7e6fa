"""swiftserve.supervisor with real short-lived processes: a crashing child is restarted with
exponential backoff and given up after its restart limit while a healthy child keeps running;
stop() ends everything, SIGKILL for a child that ignores SIGTERM."""

import sys
import time

from swiftserve.supervisor import RestartPolicy, Supervisor
import pytest

pytestmark = pytest.mark.e2e

CRASH = [sys.executable, "-c", "import sys; sys.exit(3)"]
SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]
STUBBORN = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(60)"]


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def wait_exit(child, timeout=20.0):
    deadline = time.monotonic() + timeout
    while child.proc.poll() is None:
        assert time.monotonic() < deadline, f"{child.name} did not exit"
        time.sleep(0.02)


def test_crashing_child_restarts_with_backoff_then_is_given_up():
    clock, said = Clock(), []
    sup = Supervisor(RestartPolicy(backoff_initial=1, backoff_max=4, max_restarts=3, window=100), now=clock,
                     say=said.append)
    crash, steady = sup.start("worker 1", CRASH), sup.start("worker 2", SLEEP)
    pids, delays = [crash.proc.pid], []
    try:
        for _ in range(3):
            wait_exit(crash)
            sup.poll()                                  # exit seen: a restart is scheduled
            delays.append(crash.restart_at - clock.t)
            clock.t += delays[-1] - 0.01
            sup.poll()
            assert crash.proc.pid == pids[-1]           # not before the backoff has passed
            clock.t += 0.01
            sup.poll()
            assert crash.proc.pid != pids[-1]           # restarted with the same command
            pids.append(crash.proc.pid)
        assert delays == [1, 2, 4]
        wait_exit(crash)
        sup.poll()
        assert crash.given_up and crash.restart_at is None and crash.total_restarts == 3
        clock.t += 1000
        sup.poll()
        assert crash.proc.pid == pids[-1]               # stays down
        assert steady.running and steady.total_restarts == 0
        assert any("giving up" in m for m in said) and any("exited with 3; restarting in 1s" in m for m in said)
    finally:
        sup.stop(grace=5)
    assert not steady.running


def test_restarts_outside_the_window_are_forgotten():
    clock = Clock()
    sup = Supervisor(RestartPolicy(backoff_initial=1, max_restarts=2, window=10), now=clock, say=lambda m: None)
    crash = sup.start("w", CRASH)
    try:
        for _ in range(5):                              # one crash every 20 s: never 2 within 10 s
            wait_exit(crash)
            clock.t += 20
            sup.poll()
            assert crash.restart_at - clock.t == 1      # backoff starts over, too
            clock.t += 1
            sup.poll()
        assert not crash.given_up and crash.total_restarts == 5
    finally:
        sup.stop(grace=5)


def test_stop_kills_a_child_that_ignores_sigterm():
    import subprocess

    sup = Supervisor(popen=lambda cmd: subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True))
    stubborn, polite = sup.start("stubborn", STUBBORN), sup.start("polite", SLEEP)
    assert stubborn.proc.stdout.readline().strip() == "ready"   # its SIGTERM handler is installed
    t0 = time.monotonic()
    sup.stop(grace=1.0)
    assert polite.proc.returncode == -15 and stubborn.proc.returncode == -9
    assert time.monotonic() - t0 < 10


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"     # a zombie waiting for its reaper
    except FileNotFoundError:
        return True


def test_a_dead_childs_leftover_processes_are_killed(tmp_path):
    # A vLLM worker's engine processes outlive its killed API process; the supervisor reaps its group.
    pid_file = tmp_path / "grandchild"
    sup = Supervisor(RestartPolicy(backoff_initial=60), say=lambda m: None)
    child = sup.start("w", ["sh", "-c", f"sleep 60 & echo $! > {pid_file}; exec sleep 60"])
    for _ in range(100):
        if pid_file.exists() and pid_file.read_text().strip():
            break
        time.sleep(0.05)
    grandchild = int(pid_file.read_text())
    child.proc.kill()
    child.proc.wait()
    assert not _gone(grandchild)                       # the orphan lives on its own
    sup.poll()                                         # sees the exit: reaps the group, schedules a restart
    for _ in range(100):
        if _gone(grandchild):
            break
        time.sleep(0.05)
    assert _gone(grandchild)
    sup.kill()
