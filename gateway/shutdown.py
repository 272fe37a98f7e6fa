"""Graceful shutdown of a gateway: ``Drain`` (on ``app.state.drain``) and ``DrainingServer``.

On the first SIGTERM or SIGINT the gateway drains, as a worker does (worker.shutdown):

1. it keeps listening, but new proxied requests get 503 ``shutting_down`` with
   ``Retry-After`` (a load balancer or client retries them on another gateway replica);
2. ``/health`` answers 503, so load balancers and readiness probes take it out of rotation;
3. requests in flight (streams included; a stream whose worker fails meanwhile still
   migrates to another worker) run to completion for at most ``drain_timeout`` seconds;
4. when none is left, or at the deadline, the server closes (uvicorn's shutdown, which
   gives what still runs ``ABORT_GRACE`` seconds before cancelling it: the client's
   connection is to this process, so nothing else can carry such a stream on).

A second signal falls back to uvicorn's own handling (close now).
"""

from __future__ import annotations

import logging
import time

import uvicorn

log = logging.getLogger(__name__)
ABORT_GRACE = 5.0


class Drain:
    """The gateway's drain state and its count of proxied requests in flight."""

    def __init__(self) -> None:
        self.draining = False
        self.in_flight = 0


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, drain: Drain, drain_timeout: float) -> None:
        config.timeout_graceful_shutdown = ABORT_GRACE
        super().__init__(config)
        self.drain, self.drain_timeout = drain, drain_timeout
        self.deadline: float | None = None

    def handle_exit(self, sig, frame) -> None:
        if self.drain.draining or self.should_exit:
            super().handle_exit(sig, frame)
            return
        self.drain.draining = True          # read on the event loop's thread: a flag is enough

    async def on_tick(self, counter: int) -> bool:
        d = self.drain
        if d.draining and not self.should_exit:
            now = time.monotonic()
            if self.deadline is None:
                self.deadline = now + self.drain_timeout
                log.info("draining: %d requests in flight, %.0f s to finish", d.in_flight, self.drain_timeout)
            if d.in_flight == 0:
                log.info("drained; shutting down")
                self.should_exit = True
            elif now >= self.deadline:
                log.warning("drain deadline: %d requests still in flight; closing", d.in_flight)
                self.should_exit = True
        return await super().on_tick(counter)
