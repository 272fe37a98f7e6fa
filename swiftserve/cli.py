"""``swiftserve up``: start a whole stack (gateway + N workers) on one machine.

It prepares the model once (so workers do not race on the download), starts each
worker and then the gateway as child processes, waits until every worker answers
``/health`` and then until the gateway routes to all of them, and prints how to call
it (a child that exits during start-up stops everything: that is a configuration
error). Then it supervises (``swiftserve.supervisor``): a child that exits is
restarted with backoff, up to ``--max-restarts`` times in ``--restart-window``
seconds, while the gateway and the other workers keep serving (the gateway's health
checks take a dead worker out of rotation and re-admit it when it is back). SIGHUP
restarts the workers one at a time (``swiftserve.rolling``: drain, restart, wait until the
gateway routes to it again; streams the drain cannot finish migrate). Only
Ctrl-C / SIGTERM stops the stack: SIGTERM to every child (workers drain their
in-flight requests for ``--drain-timeout`` seconds), then SIGKILL after a grace period.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import urllib.request

from swiftserve.rolling import RollingRestart
from swiftserve.supervisor import RestartPolicy, Supervisor


CURL_EXAMPLE = """\
Gateway ready at http://{host}:{port}  (model "{model}", {n} workers: {workers})
Try:
  curl http://{host}:{port}/v1/completions -H 'Content-Type: application/json' \\
    -d '{{"model": "{model}", "prompt": "The capital of France is", "max_tokens": 16, "temperature": 0}}'
Metrics: http://{host}:{port}/metrics   Stop: Ctrl-C   Rolling restart of the workers: kill -HUP {pid}
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="swiftserve", description="SwiftServe: OpenAI-compatible LLM serving.")
    sub = p.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a gateway and N reference-engine workers on this machine",
                        description="Prepare the model, start N workers and a gateway, wait until healthy, "
                                    "print a curl example, and supervise until Ctrl-C. SIGHUP (kill -HUP <pid>) "
                                    "restarts the workers one at a time: each drains, starts again and is routed "
                                    "to before the next; streams its drain cannot finish migrate to another "
                                    "worker.")
    up.add_argument("--model", default="default",
                    help="model directory, or 'default' for the embedded SmolLM2-135M-Instruct (default: %(default)s)")
    up.add_argument("--served-model-name", default=None,
                    help="model name clients send (default: the directory name)")
    up.add_argument("--workers", type=int, default=2, help="number of worker processes (default: %(default)s)")
    up.add_argument("--host", default="127.0.0.1", help="interface to bind (default: %(default)s)")
    up.add_argument("--port", type=int, default=8000, help="gateway port (default: %(default)s)")
    up.add_argument("--worker-base-port", type=int, default=8100,
                    help="first worker port; worker i listens on base+i (default: %(default)s)")
    up.add_argument("--policy", default=None, help="gateway routing policy (see swiftserve-gateway --help)")
    up.add_argument("--kv-methods", default=None, metavar="JSON",
                    help='KV methods for every worker, e.g. \'{"zack": {"rate": 0.5}}\' (see swiftserve-worker '
                         '--help); checked against the model before any worker starts')
    up.add_argument("--worker-arg", action="append", default=[], metavar="ARG",
                    help="extra argument passed to every worker, e.g. --worker-arg=--kv-cache-dtype=fp8_e4m3 "
                         "(repeatable)")
    up.add_argument("--startup-timeout", type=float, default=600.0,
                    help="seconds to wait for all processes to become healthy (default: %(default)s)")
    sv = RestartPolicy()
    up.add_argument("--max-restarts", type=int, default=sv.max_restarts,
                    help="a crashed process is restarted (1, 2, 4 ... s backoff) at most this many times within "
                         "--restart-window; then it stays down and the rest keeps serving (default: %(default)s)")
    up.add_argument("--restart-window", type=float, default=sv.window,
                    help="seconds over which restarts are counted (default: %(default)s)")
    up.add_argument("--drain-timeout", type=float, default=30.0,
                    help="on Ctrl-C / SIGTERM (and for each worker of a rolling restart), seconds workers give "
                         "in-flight requests to finish (default: %(default)s)")
    return p


def _healthy(url: str, routable: int | None = None) -> bool:
    """``/health`` answers 200 (and, for the gateway, it routes to ``routable`` workers)."""
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as r:
            if r.status != 200:
                return False
            return routable is None or json.loads(r.read()).get("routable_workers", 0) >= routable
    except Exception:  # noqa: BLE001 - any failure means "not yet"
        return False


def up(args: argparse.Namespace) -> int:
    from modelkit.models import resolve_model  # lazy: pulls in the model toolkit only here

    for flag, value, low in (("--workers", args.workers, 1), ("--max-restarts", args.max_restarts, 0),
                             ("--restart-window", args.restart_window, 0), ("--drain-timeout", args.drain_timeout, 0)):
        if value < low:
            print(f"swiftserve up: {flag} must be >= {low}", file=sys.stderr)
            return 2

    model_dir = resolve_model(args.model)
    name = args.served_model_name or model_dir.name
    kv_args: list[str] = []
    if args.kv_methods is not None:
        try:
            if not isinstance(json.loads(args.kv_methods), dict):
                raise json.JSONDecodeError("must be a JSON object", args.kv_methods, 0)
        except json.JSONDecodeError as exc:
            print(f"swiftserve: --kv-methods is not valid JSON: {exc}", file=sys.stderr)
            return 2
        kv_args = ["--kv-methods", args.kv_methods]
    from worker.cli import preflight     # the worker's own checks, once, before any process starts

    reason = preflight(["--model", str(model_dir), *kv_args, *args.worker_arg])
    if reason:
        print(f"swiftserve: workers cannot start: {reason}", file=sys.stderr)
        return 2
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 2))
    threads = max(1, len(cpus) // max(1, args.workers))
    # Each worker on its own share of the cores when they divide (engines bind OpenMP to what they may use).
    shares = [cpus[i * threads:(i + 1) * threads] for i in range(args.workers)] \
        if threads * args.workers <= len(cpus) and "--cpu-affinity" not in " ".join(args.worker_arg) else None
    py = sys.executable
    worker_urls = []
    stopping = False

    sup = Supervisor(RestartPolicy(max_restarts=args.max_restarts, window=args.restart_window))

    def on_signal(signum, _frame):
        nonlocal stopping
        if stopping:                    # a second Ctrl-C: do not wait for the drain
            print("swiftserve: killing the stack", file=sys.stderr)
            sup.kill()
        stopping = True

    roll = {"asked": False, "run": None}

    def on_hup(_signum, _frame):
        roll["asked"] = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_hup)
    try:
        for i in range(args.workers):
            port = args.worker_base_port + i
            cmd = [py, "-m", "worker", "--model", str(model_dir), "--served-model-name", name,
                   "--host", args.host, "--port", str(port), "--torch-threads", str(threads),
                   "--drain-timeout", str(args.drain_timeout), *kv_args, *args.worker_arg]
            if shares:
                cmd += ["--cpu-affinity", ",".join(str(c) for c in shares[i])]
            sup.start(f"worker {i + 1} (:{port})", cmd)
            worker_urls.append(f"http://{args.host}:{port}")
        gw = [py, "-m", "gateway", "--host", args.host, "--port", str(args.port), "--workers", ",".join(worker_urls),
              "--drain-timeout", str(args.drain_timeout)]
        if args.policy:
            gw += ["--policy", args.policy]
        sup.start(f"gateway (:{args.port})", gw)
        gateway_url = f"http://{args.host}:{args.port}"
        deadline = time.monotonic() + args.startup_timeout
        pending = set(worker_urls) | {gateway_url}
        while pending and not stopping:
            for u in sorted(pending - {gateway_url}):
                if _healthy(u):
                    pending.discard(u)
            # Ready only when the gateway itself routes to every worker (its health checks
            # have seen them up), so the first request after "ready" cannot get a 503.
            if pending == {gateway_url} and _healthy(gateway_url, routable=args.workers):
                pending.clear()
            failed = sup.exited()
            if failed:
                print(f"swiftserve: {failed[0].name} exited with {failed[0].proc.returncode} during start-up; "
                      "stopping", file=sys.stderr)
                return 1
            if time.monotonic() > deadline:
                print(f"swiftserve: not healthy after {args.startup_timeout:.0f}s: {sorted(pending)}", file=sys.stderr)
                return 1
            time.sleep(0.5)
        if stopping:
            return 130
        print(CURL_EXAMPLE.format(host=args.host, port=args.port, model=name, n=args.workers,
                                  workers=", ".join(worker_urls), pid=os.getpid()), flush=True)
        while not stopping:
            sup.poll()
            if roll["asked"] and (roll["run"] is None or roll["run"].done):
                roll["asked"] = False
                roll["run"] = RollingRestart(
                    sup, list(zip(sup.children[:args.workers], worker_urls)),
                    ready=lambda: _healthy(gateway_url, routable=args.workers), healthy=_healthy,
                    exit_timeout=args.drain_timeout + 15, health_timeout=args.startup_timeout)
                sup.say("rolling restart of the workers, one at a time")
            if roll["run"] is not None:
                roll["run"].step()
            time.sleep(0.5)
        return 0
    finally:
        sup.stop(grace=args.drain_timeout + 10)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "up":
        return up(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
