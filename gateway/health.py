"""Worker health: active checks with thresholds, passive outcomes with a circuit breaker.

Active: ``GET /health`` every ``interval`` seconds; a worker turns unhealthy after
``fail_threshold`` consecutive failures and healthy again after ``success_threshold``
consecutive successes (separate thresholds: no flapping on one lost probe). A worker
that has never answered a probe (still loading its model) has no history to protect:
its first failed probe marks it unhealthy and its first good probe marks it healthy,
so a fresh stack routes as soon as its workers are up.

Passive: every proxied request reports its outcome. ``breaker_failures`` consecutive
failures (connection errors, timeouts before the first byte, 5xx) open the circuit
for ``breaker_cooldown`` seconds; then one trial request is let through (half-open);
its success closes the circuit, its failure re-opens it. Only the worker's own faults
count: a 4xx never does, nor a 5xx the worker marks as the request's
(``swiftcommon.faults``; gateway.proxy reports those as neutral), so hostile requests
cannot open the circuit of a healthy worker.

``last_ok[url]`` is the monotonic time of the worker's last passed probe: with the
scraper's ``scraped_at`` it tells the proxy whether a worker that has not answered a
request yet is alive at all (gateway.proxy gives up on a silent one after ``--stall-timeout``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import aiohttp

from gateway.routing.base import WorkerState

log = logging.getLogger(__name__)


@dataclass
class HealthPolicy:
    interval: float = 1.0
    timeout: float = 1.0
    fail_threshold: int = 3
    success_threshold: int = 2
    breaker_failures: int = 5
    breaker_cooldown: float = 10.0


class Health:
    def __init__(self, policy: HealthPolicy) -> None:
        self.p = policy
        self._fails: dict[str, int] = {}
        self._oks: dict[str, int] = {}
        self._seen_up: set[str] = set()     # workers that have passed at least one probe
        self.last_ok: dict[str, float] = {}  # url -> monotonic time of its last passed probe

    # ---- active -----------------------------------------------------------------------------
    def probe_result(self, w: WorkerState, ok: bool) -> None:
        first_time = w.url not in self._seen_up
        if ok:
            self.last_ok[w.url] = time.monotonic()
            self._seen_up.add(w.url)
            self._fails[w.url] = 0
            self._oks[w.url] = self._oks.get(w.url, 0) + 1
            if not w.healthy and (first_time or self._oks[w.url] >= self.p.success_threshold):
                log.info("worker %s is healthy", w.url)
                w.healthy = True
        else:
            self._oks[w.url] = 0
            self._fails[w.url] = self._fails.get(w.url, 0) + 1
            if w.healthy and (first_time or self._fails[w.url] >= self.p.fail_threshold):
                log.warning("worker %s is unhealthy (%d failed probes)", w.url, self._fails[w.url])
                w.healthy = False

    async def probe(self, client: aiohttp.ClientSession, w: WorkerState) -> None:
        try:
            async with client.get(w.url + "/health", timeout=aiohttp.ClientTimeout(total=self.p.timeout)) as r:
                await r.read()
                ok = r.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            ok = False
        self.probe_result(w, ok)

    async def run(self, client: aiohttp.ClientSession, workers) -> None:
        while True:
            await asyncio.gather(*(self.probe(client, w) for w in list(workers())))
            await asyncio.sleep(self.p.interval)

    # ---- passive ------------------------------------------------------------------------------
    def on_dispatch(self, w: WorkerState, now: float) -> None:
        if w.open_until and w.open_until <= now:
            w.trial_in_flight = True            # half-open: this request is the trial

    def on_result(self, w: WorkerState, ok: bool, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        was_trial = w.trial_in_flight
        w.trial_in_flight = False
        if ok:
            w.failures = 0
            if w.open_until:
                log.info("circuit to %s closed", w.url)
            w.open_until = 0.0
            return
        w.failures += 1
        if was_trial or w.failures >= self.p.breaker_failures:
            w.open_until = now + self.p.breaker_cooldown
            log.warning("circuit to %s open for %.0fs after %d failures", w.url, self.p.breaker_cooldown, w.failures)
