"""Rolling restart of a local stack's workers (``swiftserve up``, on SIGHUP): one at a time.

For each worker in turn, ``RollingRestart.step()`` (called periodically, like the
supervisor's ``poll``) moves through:

1. ``drain``: wait until every worker is healthy and the gateway routes to all of them,
   then SIGTERM this one. The worker drains (``worker.shutdown``): new requests get 503
   and the gateway retries them on another worker, its health turns 503 so the gateway
   stops routing to it, in-flight requests finish for ``--drain-timeout`` s, and those
   still running are aborted with ``stop_reason "worker_shutdown"``, which the gateway
   migrates to another worker (gateway.failover). So a restart loses no request.
2. ``exit``: wait for the process to end (SIGKILL after ``exit_timeout`` s);
3. ``health``: start it again with the same command and wait until it is healthy and
   the gateway routes to it again (at most ``health_timeout`` s; then the restart stops
   there, loudly, and the supervisor's usual restarts take over).

While a worker is being restarted its ``Child.held`` is set, so the supervisor does not
restart it on its own (its exit is expected). Only one worker is ever down.
"""

from __future__ import annotations

import signal
import time
from typing import Callable


class RollingRestart:
    def __init__(self, sup, workers: list[tuple[object, str]], ready: Callable[[], bool],
                 healthy: Callable[[str], bool], exit_timeout: float, health_timeout: float,
                 now: Callable[[], float] = time.monotonic) -> None:
        """``workers``: (supervisor Child, URL) pairs; ``ready()``: the gateway routes to every worker."""
        self.sup, self.workers, self.ready, self.healthy = sup, list(workers), ready, healthy
        self.exit_timeout, self.health_timeout, self.now = exit_timeout, health_timeout, now
        self.i, self.phase, self.since = 0, "drain", now()
        self.done = False
        self.restarted: list[str] = []

    def step(self) -> None:
        if self.done:
            return
        child, url = self.workers[self.i]
        now = self.now()
        if self.phase == "drain":
            if not self.ready():
                return                                  # someone else is down: never two at once
            if not child.running:                       # crashed meanwhile: the supervisor handles it
                self._next()
                return
            child.held = True
            child.proc.send_signal(signal.SIGTERM)
            self.sup.say(f"rolling restart: draining {child.name}")
            self.phase, self.since = "exit", now
        elif self.phase == "exit":
            if child.proc.poll() is None:
                if now - self.since > self.exit_timeout:
                    child.proc.kill()
                return
            self.sup.respawn(child)
            self.phase, self.since = "health", now
        elif self.phase == "health":
            if self.healthy(url) and self.ready():
                child.held = False
                self.restarted.append(child.name)
                self.sup.say(f"rolling restart: {child.name} is back ({len(self.restarted)} of {len(self.workers)})")
                self._next()
            elif now - self.since > self.health_timeout:
                child.held = False
                self.done = True
                self.sup.say(f"rolling restart: {child.name} not healthy after {self.health_timeout:.0f}s; stopping "
                             "the rolling restart here")

    def _next(self) -> None:
        self.i, self.phase, self.since = self.i + 1, "drain", self.now()
        if self.i >= len(self.workers):
            self.done = True
            self.sup.say("rolling restart: done")
