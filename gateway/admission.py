"""Admission control: per-worker capacity, a bounded FIFO wait queue, 429 when full.

A worker is saturated when ``max_inflight_per_worker`` (> 0) requests are in flight to
it. When every routable worker is saturated, a request waits (FIFO) for a slot for at
most ``queue_timeout`` seconds; at most ``max_queue`` requests wait. Beyond that: 429
with Retry-After. With no routable worker at all: 503.

Several model pools share one queue (gateway.pools): a waiter remembers the workers it may
use (``workers``, less ``exclude``), a newcomer queues only behind waiters that want one of
the workers it could take, and a freed slot wakes the oldest waiter that can use a worker
with room now, so a busy pool never holds up another one.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque


class Rejected(Exception):
    def __init__(self, status: int, reason: str, message: str, retry_after: float = 1.0):
        super().__init__(message)
        self.status, self.reason, self.retry_after = status, reason, retry_after


class _Waiter:
    __slots__ = ("fut", "workers", "exclude")

    def __init__(self, fut, workers, exclude) -> None:
        self.fut, self.workers, self.exclude = fut, workers, exclude

    def wants(self, urls: set[str]) -> bool:
        return any(w.url in urls and w.url not in self.exclude for w in self.workers())


class Admission:
    def __init__(self, max_inflight_per_worker: int = 0, max_queue: int = 256, queue_timeout: float = 30.0):
        self.cap = max_inflight_per_worker
        self.max_queue = max_queue
        self.queue_timeout = queue_timeout
        self._waiters: deque[_Waiter] = deque()

    @property
    def queued(self) -> int:
        return len(self._waiters)

    def has_room(self, w) -> bool:
        return self.cap <= 0 or w.in_flight < self.cap

    async def acquire(self, workers, choose, exclude: set[str] = frozenset()):
        """Pick a worker with room via ``choose(candidates)``; wait in the queue if all are full."""
        deadline = time.monotonic() + self.queue_timeout
        while True:
            now = time.monotonic()
            live = [w for w in workers() if w.routable(now) and w.url not in exclude]
            if not live:
                raise Rejected(503, "no_worker", "No healthy worker is available.")
            room = [w for w in live if self.has_room(w)]
            ahead = bool(room) and any(x.wants({w.url for w in room}) for x in self._waiters)
            if room and not ahead:
                w = choose(room)
                if w is not None:
                    return w
            if ahead:
                self._wake()                      # let the head of the queue go first
            if len(self._waiters) >= self.max_queue:
                raise Rejected(429, "queue_full", "All workers are busy and the queue is full; retry later.")
            waiter = _Waiter(asyncio.get_running_loop().create_future(), workers, exclude)
            self._waiters.append(waiter)
            try:
                await asyncio.wait_for(waiter.fut, max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                raise Rejected(429, "queue_timeout",
                               f"All workers stayed busy for {self.queue_timeout:.0f}s; retry later.") from None
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
            # woken: loop and try again (still FIFO: we were the oldest waiter a worker had room for)
            room = [w for w in workers() if w.routable(time.monotonic()) and self.has_room(w) and w.url not in exclude]
            if room:
                w = choose(room)
                if w is not None:
                    return w

    def release(self) -> None:
        """A slot was freed: wake the oldest waiter that can use it."""
        self._wake()

    def _wake(self) -> None:
        now = time.monotonic()
        for x in list(self._waiters):
            if x.fut.done():
                self._waiters.remove(x)
                continue
            room = {w.url for w in x.workers() if w.routable(now) and self.has_room(w)}
            if x.wants(room):
                self._waiters.remove(x)
                x.fut.set_result(None)
                return
