"""Helpers for tests that start real servers: a free loopback port, and waiting until a
started process answers ``GET /health`` with 200.

Importable from every test module as ``proc_support``: ``tests/`` is on ``sys.path``
because ``tests/conftest.py`` lives there (pytest's default ``prepend`` import mode)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float, log=None) -> None:
    """Poll ``url/health`` until 200; fail at once if ``proc`` exits, or after ``timeout``
    seconds. ``log``: the process's output file, whose tail goes into the failure message."""

    def tail() -> str:
        if log is None:
            return ""
        log.seek(0)
        return ":\n" + log.read()[-4000:]

    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{url}: process exited with {proc.returncode}{tail()}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"{url} not healthy after {timeout} s{tail()}")


def stop_groups(procs: list[subprocess.Popen], timeout: float = 60) -> None:
    """SIGTERM the process group of each process still running (started with
    ``start_new_session=True``), then SIGKILL a group that outlives ``timeout``."""
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
