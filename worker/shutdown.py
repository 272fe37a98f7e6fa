"""Graceful shutdown of a worker: ``DrainingServer`` (a uvicorn server).

On the first SIGTERM or SIGINT the worker *drains* instead of closing at once:

1. admission stops: new generation requests get 503 ``shutting_down`` (the gateway
   retries them on another worker before any byte was sent);
2. ``/health`` answers 503, so routers' health checks take the worker out of rotation;
3. in-flight requests run to completion, for at most ``drain_timeout`` seconds; those
   still running then are aborted in the engine, so each ends with an explicit
   ``finish_reason: "abort"`` and ``stop_reason: "worker_shutdown"`` (streams still end with
   ``[DONE]``), never a cut connection; a SwiftServe gateway migrates such a stream to
   another worker (``worker.continuation``), so the client does not see the abort;
4. when nothing is in flight the server closes (uvicorn's normal shutdown, then the
   app's lifespan stops the engine) and the process exits 0.

A second signal falls back to uvicorn's own handling (close now; a third forces).

A dead engine (its process or thread died, it failed its own canary check, or it hung for
``--engine-step-timeout``) always ends in a restart: the worker stops admitting (503
``shutting_down``: a gateway retries elsewhere), ``/health`` turns 503, the streams it had
already ended with an error event, and the process exits with ``ENGINE_DEAD_EXIT`` so that
its supervisor (``swiftserve up``, Kubernetes, docker's restart policy) starts it again. A
worker never stays up answering 503 forever.
"""

from __future__ import annotations

import logging
import time

import uvicorn

log = logging.getLogger(__name__)
ABORT_GRACE = 5.0       # seconds after the aborts for the aborted streams to end
ENGINE_DEAD_EXIT = 3    # the exit status of a worker whose engine died


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, serving, drain_timeout: float) -> None:
        super().__init__(config)
        self.serving, self.drain_timeout = serving, drain_timeout
        self.drain_deadline: float | None = None
        self.aborted = False
        self.engine_dead = False

    def handle_exit(self, sig, frame) -> None:
        if self.serving.draining or self.should_exit:
            super().handle_exit(sig, frame)
            return
        # Runs in the main thread between bytecodes (as the event loop does): a flag is enough.
        self.serving.draining = True

    async def on_tick(self, counter: int) -> bool:
        s = self.serving
        if not self.should_exit and not self.engine_dead and not s.engine.healthy():
            log.error("the engine is dead: the worker exits (status %d) so that its supervisor restarts it",
                      ENGINE_DEAD_EXIT)
            self.engine_dead = s.draining = True        # new requests 503, /health 503 meanwhile
            self.should_exit = True
        if s.draining and not self.should_exit:
            now = time.monotonic()
            if self.drain_deadline is None:
                self.drain_deadline = now + self.drain_timeout
                log.info("draining: %d requests in flight, %.0f s to finish", s.in_flight, self.drain_timeout)
            if s.in_flight == 0:
                log.info("drained; shutting down")
                self.should_exit = True
            elif now >= self.drain_deadline and not self.aborted:
                self.aborted = True
                s.drain_aborting = True     # the aborted choices say so (stop_reason DRAIN_ABORT): gateways migrate them
                log.warning("drain deadline: aborting %d engine requests", len(s.active))
                for rid in list(s.active):
                    await s.engine.abort(rid)
            elif now >= self.drain_deadline + ABORT_GRACE:
                log.error("%d requests still in flight after the aborts; closing", s.in_flight)
                self.should_exit = True
        return await super().on_tick(counter)
