"""``swiftserve up``: start a whole stack (gateway + N workers per model) on one machine.
(``swiftserve bench <concern> <name>`` runs one of the maintained benchmarks: benchmarks/cli.py.)

It serves one model or several (``--model A --model B:1``, swiftserve.stack_models: each
model its own workers, the gateway routing each request to its model's pool, with aliases,
weighted splits and the shadow comparison configured by ``--alias`` / ``--models-config`` /
``--shadow-fraction``). It prepares each model once (so workers do not race on the download),
starts each worker and then the gateway as child processes, waits until every worker answers
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

``up`` is a row of named steps: ``check_args`` -> ``resolve_model`` (each model) -> ``check_workers``
(the worker CLI's ``preflight`` on the workers' arguments: the same KV check the engine
runs, with block size, KV dtype and SwiftKV, so a bad combination stops here, before any
process starts) -> ``plan_stack`` (command lines only) -> ``StackRun.run`` (start,
``wait_ready``, ``supervise``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from swiftserve.rolling import RollingRestart
from swiftserve.stack_models import ModelSpec, check_aliases, check_names, gateway_model_args, parse_specs
from swiftserve.supervisor import RestartPolicy, Supervisor


CURL_EXAMPLE = """\
Gateway ready at http://{host}:{port}  (models {models}; {n} workers: {workers})
Try:
  curl http://{host}:{port}/v1/completions -H 'Content-Type: application/json' \\
    -d '{{"model": "{model}", "prompt": "The capital of France is", "max_tokens": 16, "temperature": 0}}'
Metrics: http://{host}:{port}/metrics   Stop: Ctrl-C   Rolling restart of the workers: kill -HUP {pid}
"""


def _kv_methods(text: str):
    """``--kv-methods`` decoded by the worker's own parser (lazy: the KV registry loads only when given)."""
    from worker.args import kv_methods_arg

    return kv_methods_arg(text)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="swiftserve", description="SwiftServe: OpenAI-compatible LLM serving.")
    sub = p.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a gateway and N reference-engine workers per model on this machine",
                        description="Prepare the model(s), start the workers and a gateway, wait until healthy, "
                                    "print a curl example, and supervise until Ctrl-C. SIGHUP (kill -HUP <pid>) "
                                    "restarts the workers one at a time: each drains, starts again and is routed "
                                    "to before the next; streams its drain cannot finish migrate to another "
                                    "worker of the same model.")
    sub.add_parser("bench", add_help=False, help="run a benchmark: swiftserve bench <concern> <name> [args] "
                                                 "(swiftserve bench --help lists them)")
    up.add_argument("--model", action="append", default=None, metavar="MODEL[:N]",
                    help="model directory or name ('default': the embedded SmolLM2-135M-Instruct; a shipped variant "
                         "such as SmolLM2-135M-Instruct-SwiftKV-13pct), with ':N' its number of workers (else "
                         "--workers). Repeat for several models: the gateway routes each request to a worker of its "
                         "model (default: default)")
    up.add_argument("--served-model-name", action="append", default=None,
                    help="model name clients send (default: the directory name); once per --model, in order")
    up.add_argument("--workers", type=int, default=2,
                    help="worker processes per model without ':N' (default: %(default)s)")
    up.add_argument("--host", default="127.0.0.1", help="interface to bind (default: %(default)s)")
    up.add_argument("--port", type=int, default=8000, help="gateway port (default: %(default)s)")
    up.add_argument("--worker-base-port", type=int, default=8100,
                    help="first worker port; worker i listens on base+i (default: %(default)s)")
    up.add_argument("--policy", default=None, help="gateway routing policy (see swiftserve-gateway --help)")
    up.add_argument("--alias", action="append", default=[], metavar="NAME=MODEL[:W][,MODEL[:W]...]",
                    help="a public name split over served models by weight, e.g. "
                         "smollm2=SmolLM2-135M-Instruct:90,SmolLM2-135M-Instruct-SwiftKV:10 (repeatable; "
                         "swiftserve-gateway --help)")
    up.add_argument("--models-config", default=None, metavar="FILE",
                    help="the gateway's alias / split / shadow file, re-read when it changes (docs/gateway.md)")
    up.add_argument("--shadow-fraction", type=float, default=0.0,
                    help="share of a canary's requests the original scores (the first target of an --alias is "
                         "the original) (default: %(default)s: off)")
    up.add_argument("--gateway-arg", action="append", default=[], metavar="ARG",
                    help="extra argument passed to the gateway, e.g. --gateway-arg=--shadow-max-rps=5 (repeatable)")
    up.add_argument("--kv-methods", type=_kv_methods, default=None, metavar="JSON",
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


# ---- the steps of ``up``, in order ------------------------------------------------------------
def check_args(args: argparse.Namespace) -> str | None:
    """Step 1: the numbers ``up`` itself takes; None when they are usable."""
    for flag, value, low in (("--workers", args.workers, 1), ("--max-restarts", args.max_restarts, 0),
                             ("--restart-window", args.restart_window, 0), ("--drain-timeout", args.drain_timeout, 0)):
        if value < low:
            return f"{flag} must be >= {low}"
    if not 0 <= args.shadow_fraction <= 1:
        return "--shadow-fraction must be between 0 and 1"
    return None


def worker_args(args: argparse.Namespace) -> list[str]:
    """The arguments every worker gets from ``up``'s own flags and ``--worker-arg``."""
    kv = ["--kv-methods", args.kv_methods.to_json()] if args.kv_methods is not None else []
    return [*kv, *args.worker_arg]


def check_workers(model_dir: Path, args: argparse.Namespace) -> str | None:
    """Step 3: the worker's own checks (arguments, KV methods against the model with every engine
    input) on the workers' arguments, once per model, before any process starts; None when they would start."""
    from worker.cli import preflight

    return preflight(["--model", str(model_dir), *worker_args(args)])


def check_models(args: argparse.Namespace, specs: list[ModelSpec]) -> str | None:
    """Step 3b: served names that tell the models apart, and aliases that name only served models."""
    from gateway.aliases import parse_alias_flag, read_aliases

    reason = check_names(specs)
    if reason:
        return reason
    try:
        aliases = [parse_alias_flag(a, args.shadow_fraction) for a in args.alias]
        if args.models_config:
            aliases += list(read_aliases(args.models_config, args.shadow_fraction).values())
    except (ValueError, OSError) as exc:
        return str(exc)
    return check_aliases(aliases, [s.served for s in specs])


def cpu_shares(workers: int, extra: list[str]) -> tuple[int, list[list[int]] | None]:
    """(torch threads per worker, each worker's CPUs or None): each worker on its own share of the
    cores when they divide (engines bind OpenMP to what they may use) and no ``--cpu-affinity`` is given."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 2))
    threads = max(1, len(cpus) // max(1, workers))
    shares = [cpus[i * threads:(i + 1) * threads] for i in range(workers)] \
        if threads * workers <= len(cpus) and "--cpu-affinity" not in " ".join(extra) else None
    return threads, shares


@dataclass
class StackPlan:
    """What ``up`` starts: every child's name and command line, and where each listens."""

    names: list[str]                            # the served model names
    workers: list[tuple[str, list[str]]]        # (child name, command)
    worker_urls: list[str]
    gateway: tuple[str, list[str]]
    gateway_url: str


def plan_stack(args: argparse.Namespace, specs: list[ModelSpec]) -> StackPlan:
    """Step 4: the workers' and the gateway's command lines (no process started): each model's
    workers on consecutive ports, every worker on its own share of the cores when they divide."""
    py = sys.executable
    total = sum(s.workers for s in specs)
    threads, shares = cpu_shares(total, args.worker_arg)
    workers, urls, several = [], [], len(specs) > 1
    for spec in specs:
        for _ in range(spec.workers):
            i = len(workers)
            port = args.worker_base_port + i
            cmd = [py, "-m", "worker", "--model", str(spec.dir), "--served-model-name", spec.served,
                   "--host", args.host, "--port", str(port), "--torch-threads", str(threads),
                   "--drain-timeout", str(args.drain_timeout), *worker_args(args)]
            if shares:
                cmd += ["--cpu-affinity", ",".join(str(c) for c in shares[i])]
            workers.append((f"worker {i + 1} (:{port}{', ' + spec.served if several else ''})", cmd))
            urls.append(f"http://{args.host}:{port}")
    gw = [py, "-m", "gateway", "--host", args.host, "--port", str(args.port), "--workers", ",".join(urls),
          "--drain-timeout", str(args.drain_timeout), *gateway_model_args(args)]
    if args.policy:
        gw += ["--policy", args.policy]
    return StackPlan([s.served for s in specs], workers, urls, (f"gateway (:{args.port})", gw),
                     f"http://{args.host}:{args.port}")


class StackRun:
    """Steps 5-7: start the children under a ``Supervisor``, wait until the stack serves, then
    supervise until Ctrl-C / SIGTERM (SIGHUP: a rolling restart of the workers)."""

    def __init__(self, args: argparse.Namespace, plan: StackPlan) -> None:
        self.args, self.plan = args, plan
        self.sup = Supervisor(RestartPolicy(max_restarts=args.max_restarts, window=args.restart_window))
        self.stopping = False
        self.roll_asked = False
        self.roll: RollingRestart | None = None

    def on_signal(self, _signum, _frame) -> None:
        if self.stopping:                    # a second Ctrl-C: do not wait for the drain
            print("swiftserve: killing the stack", file=sys.stderr)
            self.sup.kill()
        self.stopping = True

    def on_hup(self, _signum, _frame) -> None:
        self.roll_asked = True

    def run(self) -> int:
        signal.signal(signal.SIGINT, self.on_signal)
        signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGHUP, self.on_hup)
        try:
            for name, cmd in [*self.plan.workers, self.plan.gateway]:
                self.sup.start(name, cmd)
            failed = self.wait_ready()
            if failed is not None:
                return failed
            a, p = self.args, self.plan
            print(CURL_EXAMPLE.format(host=a.host, port=a.port, models=", ".join(f'"{n}"' for n in p.names),
                                      model=p.names[0], n=len(p.worker_urls), workers=", ".join(p.worker_urls),
                                      pid=os.getpid()), flush=True)
            return self.supervise()
        finally:
            self.sup.stop(grace=self.args.drain_timeout + 10)

    def gateway_routes_all(self) -> bool:
        return _healthy(self.plan.gateway_url, routable=len(self.plan.worker_urls))

    def wait_ready(self) -> int | None:
        """None once every worker is healthy and the gateway routes to all of them, else the exit
        status: 1 when a child exited or the start-up timed out, 130 when stopped meanwhile."""
        gateway_url = self.plan.gateway_url
        deadline = time.monotonic() + self.args.startup_timeout
        pending = set(self.plan.worker_urls) | {gateway_url}
        while pending and not self.stopping:
            for u in sorted(pending - {gateway_url}):
                if _healthy(u):
                    pending.discard(u)
            # Ready only when the gateway itself routes to every worker (its health checks
            # have seen them up), so the first request after "ready" cannot get a 503.
            if pending == {gateway_url} and self.gateway_routes_all():
                pending.clear()
            failed = self.sup.exited()
            if failed:
                print(f"swiftserve: {failed[0].name} exited with {failed[0].proc.returncode} during start-up; "
                      "stopping", file=sys.stderr)
                return 1
            if time.monotonic() > deadline:
                print(f"swiftserve: not healthy after {self.args.startup_timeout:.0f}s: {sorted(pending)}",
                      file=sys.stderr)
                return 1
            time.sleep(0.5)
        return 130 if self.stopping else None

    def supervise(self) -> int:
        """Restart what exits; on SIGHUP restart the workers one at a time; 0 when stopped."""
        while not self.stopping:
            self.sup.poll()
            if self.roll_asked and (self.roll is None or self.roll.done):
                self.roll_asked = False
                self.roll = RollingRestart(
                    self.sup, list(zip(self.sup.children[:len(self.plan.worker_urls)], self.plan.worker_urls)),
                    ready=self.gateway_routes_all, healthy=_healthy,
                    exit_timeout=self.args.drain_timeout + 15, health_timeout=self.args.startup_timeout)
                self.sup.say("rolling restart of the workers, one at a time")
            if self.roll is not None:
                self.roll.step()
            time.sleep(0.5)
        return 0


def up(args: argparse.Namespace) -> int:
    """``swiftserve up``: check, prepare the model, check the workers, plan, run."""
    from modelkit.models import resolve_model  # lazy: pulls in the model toolkit only here

    reason = check_args(args)
    try:
        specs = parse_specs(args.model or ["default"], args.served_model_name, args.workers)
    except ValueError as exc:
        reason = reason or str(exc)
    if reason:
        print(f"swiftserve up: {reason}", file=sys.stderr)
        return 2
    for spec in specs:
        spec.dir = resolve_model(spec.source)   # step 2: prepared once, so workers do not race on it
        reason = check_workers(spec.dir, args)
        if reason:
            print(f"swiftserve: {spec.source}: workers cannot start: {reason}", file=sys.stderr)
            return 2
    reason = check_models(args, specs)
    if reason:
        print(f"swiftserve up: {reason}", file=sys.stderr)
        return 2
    return StackRun(args, plan_stack(args, specs)).run()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:                    # the benchmarks parse their own arguments
        from benchmarks.cli import main as bench

        return bench(argv[1:], prog="swiftserve bench")
    args = _parser().parse_args(argv)
    if args.command == "up":
        return up(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
