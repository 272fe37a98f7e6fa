"""The upstream side of one dispatch (gateway.dispatch, gateway.relay, gateway.failover): the
upstream client, ``Lease`` (released exactly once), ``AttemptFailed`` (one worker could not
answer) and how a transport error becomes one.

Accounting: ``Lease.finish(ok)`` reports the outcome to the circuit breaker (None: not the
worker's doing, e.g. the client left; ``worker_neutral``: a 4xx, or a 5xx the worker marks as the
request's own fault) and frees the admission slot. Closing an upstream
response that is cut short is what tells the worker to abort.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp

from swiftcommon.faults import FAULT_HEADER, REQUEST_FAULT

RETRYABLE = (aiohttp.ClientError, asyncio.TimeoutError)
# identity: the bytes read are the bytes of the answer (checked, counted, passed on)
UPSTREAM_HEADERS = {"content-type": "application/json", "accept-encoding": "identity"}


def upstream_session(connect_timeout: float, read_timeout: float) -> aiohttp.ClientSession:
    """The forwarding client: keep-alive pool, ``read_timeout`` = longest silence from a worker."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=2000, limit_per_host=0, keepalive_timeout=60),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout, sock_read=read_timeout),
        auto_decompress=False, skip_auto_headers=("User-Agent",), cookie_jar=aiohttp.DummyCookieJar())


class AttemptFailed(Exception):
    """One worker could not answer; ``status`` is what the client gets if it was the last."""

    def __init__(self, reason: str, message: str, status: int = 502) -> None:
        super().__init__(message)
        self.reason, self.status = reason, status


class Lease:
    """One dispatch to one worker; ``finish`` releases it exactly once."""

    def __init__(self, worker, health, admission, pool) -> None:
        self.worker, self.health, self.admission, self.pool = worker, health, admission, pool
        self.done = False
        worker.in_flight += 1
        health.on_dispatch(worker, time.monotonic())

    def finish(self, ok: bool | None) -> None:
        """Release the dispatch; ``ok`` is reported to the circuit breaker (None: not the worker's doing)."""
        if self.done:
            return
        self.done = True
        self.worker.in_flight -= 1
        if ok is not None:
            self.health.on_result(self.worker, ok)
        else:
            self.worker.trial_in_flight = False
        self.admission.release()
        self.pool.reap()


def worker_neutral(resp: aiohttp.ClientResponse) -> bool:
    """An error answer that says nothing about the worker's health: a 4xx (the request's or the client's
    doing), or a 5xx the worker marks as the request's own fault (``swiftcommon.faults``)."""
    return 400 <= resp.status < 500 or resp.status >= 500 and resp.headers.get(FAULT_HEADER) == REQUEST_FAULT


def close_upstream(resp: aiohttp.ClientResponse) -> None:
    """Return a fully read connection to the pool; close one cut short (the worker then aborts)."""
    if resp.content.at_eof():
        resp.release()
    else:
        resp.close()


def transport_failure(exc: BaseException) -> AttemptFailed:
    if isinstance(exc, asyncio.TimeoutError):
        return AttemptFailed("timeout", f"{type(exc).__name__}: no answer in time", 504)
    return AttemptFailed(type(exc).__name__, f"{type(exc).__name__}: {exc or 'connection lost'}", 502)
