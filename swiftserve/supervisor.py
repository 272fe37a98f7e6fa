"""Supervision of a local stack's child processes (used by ``swiftserve up``).

``Supervisor.poll()`` is called periodically. A child that exits (crash, SIGKILL, OOM)
is restarted with the same command after an exponential backoff
(``backoff_initial * 2**k``, at most ``backoff_max``, where k counts its restarts in
the last ``window`` seconds). A child that needed ``max_restarts`` restarts within
``window`` seconds is given up (it stays down, loudly); the other children keep
running either way: one crashing worker never stops the gateway or the other workers.
A child that a rolling restart holds (``Child.held``, swiftserve.rolling) is left to it.
Only ``stop()`` (Ctrl-C / SIGTERM in ``swiftserve up``) ends them: SIGTERM to all,
then SIGKILL to whatever is still running after the grace period (``kill()`` at once).
Children run in their own session, so a terminal's Ctrl-C reaches only the supervisor,
which then sends each child exactly one SIGTERM (a second signal would make a worker
skip its drain). When a child has exited, whatever is left of its session's process group
is SIGKILLed (``reap_group``): a vLLM worker's engine processes outlive a killed API
process and would sit beside its replacement.

Pure bookkeeping around ``popen`` and ``now`` (injectable), so the policy is tested
with short-lived real processes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class RestartPolicy:
    backoff_initial: float = 1.0
    backoff_max: float = 30.0
    max_restarts: int = 5
    window: float = 300.0


@dataclass
class Child:
    name: str
    cmd: list[str]
    proc: subprocess.Popen | None = None
    restarts: deque = field(default_factory=deque)      # monotonic times of recent restarts
    restart_at: float | None = None                     # scheduled restart
    given_up: bool = False
    total_restarts: int = 0
    held: bool = False          # a rolling restart (swiftserve.rolling) stops and starts it: not restarted here

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def reap_group(proc) -> None:
    """SIGKILL what is left of a child's process group (it was started as a session leader).
    A vLLM worker runs its engine in child processes that outlive a killed or crashed API
    process: 2-3 GB orphans beside the restarted worker. Only real ``Popen`` children (tests
    pass fakes, whose pids are not ours)."""
    if isinstance(proc, subprocess.Popen):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


class Supervisor:
    def __init__(self, policy: RestartPolicy | None = None, popen: Callable | None = None,
                 now: Callable[[], float] = time.monotonic, say: Callable[[str], None] | None = None) -> None:
        self.policy = policy or RestartPolicy()
        self.popen = popen or (lambda cmd: subprocess.Popen(cmd, start_new_session=True))
        self.now = now
        self.say = say or (lambda msg: print(f"swiftserve: {msg}", file=sys.stderr, flush=True))
        self.children: list[Child] = []

    def start(self, name: str, cmd: list[str]) -> Child:
        child = Child(name, list(cmd))
        child.proc = self.popen(child.cmd)
        self.children.append(child)
        return child

    def exited(self) -> list[Child]:
        """Children whose process has ended (and is not yet restarted)."""
        return [c for c in self.children if c.proc is not None and c.proc.poll() is not None]

    def poll(self) -> None:
        now, p = self.now(), self.policy
        for c in self.children:
            if c.given_up or c.held:
                continue
            if c.restart_at is not None:
                if now >= c.restart_at:
                    c.restart_at = None
                    c.restarts.append(now)
                    c.total_restarts += 1
                    c.proc = self.popen(c.cmd)
                    self.say(f"{c.name} restarted (pid {c.proc.pid})")
                continue
            if c.proc is None or c.proc.poll() is None:
                continue
            while c.restarts and now - c.restarts[0] > p.window:
                c.restarts.popleft()
            code = c.proc.returncode
            reap_group(c.proc)
            if len(c.restarts) >= p.max_restarts:
                c.given_up = True
                self.say(f"{c.name} exited with {code}; {len(c.restarts)} restarts in {p.window:.0f}s: giving up on "
                         f"it (the rest of the stack keeps serving)")
                continue
            delay = min(p.backoff_max, p.backoff_initial * 2 ** len(c.restarts))
            c.restart_at = now + delay
            self.say(f"{c.name} exited with {code}; restarting in {delay:.0f}s "
                     f"(restart {len(c.restarts) + 1} of at most {p.max_restarts} in {p.window:.0f}s)")

    def respawn(self, child: Child) -> None:
        """Start an ended child again now (a planned restart: no backoff, not counted)."""
        child.proc = self.popen(child.cmd)
        self.say(f"{child.name} started again (pid {child.proc.pid})")

    def kill(self) -> None:
        for c in self.children:
            if c.running:
                c.proc.kill()
            if c.proc is not None:
                reap_group(c.proc)

    def stop(self, grace: float = 10.0) -> None:
        live = [c.proc for c in self.children if c.running]
        for proc in live:
            proc.send_signal(signal.SIGTERM)
        deadline = self.now() + grace
        for proc in live:
            try:
                proc.wait(max(0.1, deadline - self.now()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            reap_group(proc)
