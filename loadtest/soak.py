"""``swiftserve-loadtest soak``: a long Poisson run that fails on leaks or lost requests.

1. Starts a stack (``swiftserve up``: gateway + N workers) on free loopback ports.
2. Measures capacity: ``--capacity-seconds`` of closed-loop load (``2 x workers``
   concurrent streams) -> completed requests per second.
3. Sends Poisson arrivals at ``--load`` x capacity for ``--duration`` seconds (open
   loop), while sampling every ``--sample-interval`` s: RSS and open file descriptors
   of every process of the stack, KV blocks in use and in-flight counts of every
   worker (``/load``), the gateway's in-flight total.
4. Waits for the last requests, takes a final idle sample, and judges:
   * ``lost``: requests that ended with neither a complete answer (tokens and
     ``[DONE]``) nor an explicit error (``RequestRecord.outcome``) -> must be 0;
   * RSS growth per process: median of the last 10% of the load-phase samples
     against the median of the first 10% after a warm-up fifth of the run; the
     largest is ``rss_growth_pct`` -> at most ``--max-rss-growth-pct``;
   * open descriptors other than sockets (files, pipes, event fds): the same windows
     -> growth at most ``--max-fd-growth``;
   * sockets: the same windows -> growth at most ``--max-fd-growth`` plus two per request
     at the run's peak concurrency. Connection pools (the client's, uvicorn's, the
     gateway's to the workers) keep up to one idle connection per request that was in
     flight at once, so a burst late in a short run raises the count without a leak; a
     leak grows with the number of requests instead and still fails;
   * idle at the end: KV blocks used and in-flight counts back to 0.
5. Writes ``soak.json`` (samples, verdicts, the exact command) and ``soak.png``.

Exit status 0 only when every check passes.
"""

from __future__ import annotations

import asyncio
import json
import random
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

from loadtest.client import RequestRecord, build_body, send
from loadtest.datasets import random_prompts
from loadtest.schedule import arrival_times


def add_arguments(p) -> None:
    p.add_argument("--model", default="default", help="model for swiftserve up (default: %(default)s)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--worker-arg", action="append", default=[], metavar="ARG", help="passed to swiftserve up")
    p.add_argument("--duration", type=float, default=1800.0, help="seconds of Poisson load (default: %(default)s)")
    p.add_argument("--load", type=float, default=0.8, help="fraction of the measured capacity (default: %(default)s)")
    p.add_argument("--capacity-seconds", type=float, default=60.0, help="closed-loop capacity measurement")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--sample-interval", type=float, default=5.0)
    p.add_argument("--max-rss-growth-pct", type=float, default=10.0)
    p.add_argument("--max-fd-growth", type=int, default=20,
                   help="non-socket descriptors; sockets may also grow by 2 per peak in-flight request")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--result-dir", default="results/reliability")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_stack(a, port: int, wport: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "swiftserve", "up", "--model", a.model, "--workers", str(a.workers),
           "--port", str(port), "--worker-base-port", str(wport), *[f"--worker-arg={x}" for x in a.worker_arg]]
    log = open(Path(a.result_dir) / "soak-stack.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"swiftserve up exited with {proc.returncode}; see {log.name}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).json().get("routable_workers") == a.workers:
                return proc
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(1)
    proc.kill()
    raise RuntimeError("the stack did not become healthy")


def sample(procs: dict, workers: list[str], gateway: str, t0: float, done: int) -> dict:
    s = {"t": time.monotonic() - t0, "done": done, "rss_mb": {}, "fds": {}, "sockets": {}, "kv_blocks_used": {},
         "in_flight": {}}
    for name, p in procs.items():
        try:
            s["rss_mb"][name] = p.memory_info().rss / 2**20
            s["fds"][name] = p.num_fds()
            s["sockets"][name] = len(p.net_connections("all"))
        except Exception:  # noqa: BLE001 - a process that died shows as missing samples
            pass
    for i, w in enumerate(workers):
        try:
            load = httpx.get(w + "/load", timeout=5).json()
            s["kv_blocks_used"][f"worker{i + 1}"] = load["kv_blocks_used"]
            s["in_flight"][f"worker{i + 1}"] = load["in_flight"]
        except (httpx.HTTPError, ValueError, KeyError):
            pass
    try:
        text = httpx.get(gateway + "/metrics", timeout=5).text
        s["in_flight"]["gateway"] = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                                        if line.startswith("swiftserve_gateway_worker_in_flight{"))
    except httpx.HTTPError:
        pass
    return s


async def measure_capacity(client, url: str, bodies: list[dict], seconds: float, concurrency: int) -> float:
    """Closed loop: new requests start for ``seconds``; the last ones are waited for and
    counted (requests last seconds each on a CPU, so cutting them off would bias it low)."""
    done, stop = 0, time.monotonic() + seconds
    rng = random.Random(1)

    async def loop():
        nonlocal done
        while time.monotonic() < stop:
            rec = await send(client, url, rng.choice(bodies), RequestRecord(0.0), chat=False)
            done += rec.outcome == "complete"

    t0 = time.monotonic()
    await asyncio.gather(*(loop() for _ in range(concurrency)))
    return done / (time.monotonic() - t0)


def stack_processes(up_pid: int, wport: int) -> dict:
    """psutil handles of ``swiftserve up`` and its gateway and workers (worker i listens on wport + i - 1)."""
    import psutil

    procs = {"swiftserve-up": psutil.Process(up_pid)}
    for child in procs["swiftserve-up"].children():
        cmd = child.cmdline()
        if "gateway" in cmd:
            procs["gateway"] = child
        elif "worker" in cmd:
            procs[f"worker{int(cmd[cmd.index('--port') + 1]) - wport + 1}"] = child
    return procs


def soak_stack(a, gateway: str, workers: list[str], procs: dict) -> dict:
    """Run the soak against a running stack -> the result document (also written by ``main_from_args``)."""
    run = asyncio.run(soak(a, gateway, workers, procs))
    return {"command": "swiftserve-loadtest " + " ".join(shlex.quote(x) for x in sys.argv[1:]),
            "config": {k: v for k, v in vars(a).items() if k != "cmd"}, "verdict": judge(a, run, procs),
            "samples": run["samples"]}


def growth(samples: list[dict], key: str, name: str) -> tuple[float, float] | None:
    """(baseline, end) medians: first 10% after a warm-up fifth vs the last 10% of the load phase."""
    vals = [s[key][name] for s in samples if name in s[key]]
    if len(vals) < 10:
        return None
    n = len(vals)
    start = n // 5
    w = max(1, n // 10)
    return float(np.median(vals[start:start + w])), float(np.median(vals[-w:]))


async def soak(a, gateway: str, workers: list[str], procs: dict) -> dict:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600, connect=10), limits=limits) as client:
        model = (await client.get(gateway + "/v1/models")).json()["data"][0]["id"]
        url = gateway + "/v1/completions"
        specs = random_prompts(256, a.input_len, a.output_len, seed=a.seed)
        bodies = [build_body(s, model, True, False, {}) for s in specs]
        capacity = await measure_capacity(client, url, bodies, a.capacity_seconds, 2 * a.workers)
        rate = a.load * capacity
        n = max(1, int(rate * a.duration))
        offsets = arrival_times(n, rate, "poisson", seed=a.seed)
        records = [RequestRecord(o) for o in offsets]
        samples: list[dict] = []
        t0 = time.monotonic()
        finished = open_now = peak = 0

        async def one(i: int) -> None:
            nonlocal finished, open_now, peak
            await asyncio.sleep(max(0.0, t0 + offsets[i] - time.monotonic()))
            open_now += 1
            peak = max(peak, open_now)
            await send(client, url, bodies[i % len(bodies)], records[i], chat=False)
            open_now -= 1
            finished += 1

        async def sampler() -> None:
            while True:
                samples.append(await asyncio.to_thread(sample, procs, workers, gateway, t0, finished))
                await asyncio.sleep(a.sample_interval)

        task = asyncio.create_task(sampler())
        await asyncio.gather(*(one(i) for i in range(n)))
        load_end = time.monotonic() - t0
        task.cancel()
        await asyncio.sleep(2)                          # let the last releases land
        idle = await asyncio.to_thread(sample, procs, workers, gateway, t0, finished)
    return {"capacity_rps": capacity, "rate_rps": rate, "records": records, "samples": samples, "idle": idle,
            "load_seconds": load_end, "peak_concurrency": peak}


def judge(a, run: dict, procs: dict) -> dict:
    recs = run["records"]
    outcomes = [r.outcome for r in recs]
    samples = run["samples"]
    # Non-socket descriptors per sample (a process whose sockets could not be read counts all its descriptors).
    others = [{"other_fds": {n: v - s["sockets"].get(n, 0) for n, v in s["fds"].items()}} for s in samples]
    rss, fds, sockets = {}, {}, {}
    for name in procs:
        g = growth(samples, "rss_mb", name)
        if g:
            rss[name] = {"baseline_mb": g[0], "end_mb": g[1], "growth_pct": 100 * (g[1] - g[0]) / g[0]}
        f = growth(others, "other_fds", name)
        if f:
            fds[name] = {"baseline": f[0], "end": f[1], "growth": f[1] - f[0]}
        k = growth(samples, "sockets", name)
        if k:
            sockets[name] = {"baseline": k[0], "end": k[1], "growth": k[1] - k[0]}
    idle = run["idle"]
    rss_growth = max((v["growth_pct"] for v in rss.values()), default=None)
    fd_growth = max((v["growth"] for v in fds.values()), default=None)
    socket_growth = max((v["growth"] for v in sockets.values()), default=None)
    # Requests open at once: counted by the client, or the gateway's sampled in-flight total.
    peak = max([run.get("peak_concurrency", 0), *(s["in_flight"].get("gateway", 0) for s in samples)])
    socket_limit = a.max_fd_growth + 2 * peak
    checks = {
        "no_lost_requests": outcomes.count("lost") == 0,
        "rss_growth_within_limit": rss_growth is not None and rss_growth <= a.max_rss_growth_pct,
        "fd_growth_within_limit": fd_growth is not None and fd_growth <= a.max_fd_growth,
        "socket_growth_within_limit": socket_growth is None or socket_growth <= socket_limit,
        "kv_blocks_released": bool(idle["kv_blocks_used"]) and not any(idle["kv_blocks_used"].values()),
        "in_flight_zero": bool(idle["in_flight"]) and not any(idle["in_flight"].values()),
    }
    return {
        "soak_seconds": run["load_seconds"], "capacity_rps": run["capacity_rps"], "rate_rps": run["rate_rps"],
        "requests": len(recs), "complete": outcomes.count("complete"), "errors": outcomes.count("error"),
        "requests_lost": outcomes.count("lost"), "rss_growth_pct": rss_growth, "fd_growth": fd_growth,
        "socket_growth": socket_growth, "socket_growth_limit": socket_limit, "peak_in_flight": peak,
        "rss": rss, "fds": fds, "sockets": sockets, "idle": idle, "checks": checks, "passed": all(checks.values()),
        "errors_seen": sorted({r.error for r in recs if r.error})[:20],
    }


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = doc["samples"]
    t = [s["t"] / 60 for s in samples]
    fig, axes = plt.subplots(2, 2, figsize=(12, 7), sharex=True)
    first_rss = {}
    for s in samples:
        for n, v in s["rss_mb"].items():
            first_rss.setdefault(n, v)
    for ax, key, title in ((axes[0][0], "rss_mb", "RSS change from the first sample (%)"),
                           (axes[0][1], "fds", "open file descriptors"),
                           (axes[1][0], "kv_blocks_used", "KV blocks in use"), (axes[1][1], "in_flight", "in flight")):
        names = sorted({n for s in samples for n in s[key]})
        for n in names:
            ys = [s[key][n] for s in samples if n in s[key]]
            label = n
            if key == "rss_mb":
                label = f"{n} ({first_rss[n]:.0f} MiB)"
                ys = [100 * (y - first_rss[n]) / first_rss[n] for y in ys]
            ax.plot([ti for ti, s in zip(t, samples) if n in s[key]], ys, label=label, lw=1)
        ax.set_title(title)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("minutes")
    v = doc["verdict"]
    fig.suptitle(f"soak {v['soak_seconds'] / 60:.0f} min at {v['rate_rps']:.2f} req/s "
                 f"({doc['config']['load']:.0%} of {v['capacity_rps']:.2f}): {v['requests']} requests, "
                 f"{v['requests_lost']} lost, RSS growth {v['rss_growth_pct']:.1f}% max")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main_from_args(a) -> int:
    out = Path(a.result_dir)
    out.mkdir(parents=True, exist_ok=True)
    port, wport = _free_port(), _free_port()
    while port in range(wport, wport + a.workers):
        port = _free_port()
    gateway, workers = f"http://127.0.0.1:{port}", [f"http://127.0.0.1:{wport + i}" for i in range(a.workers)]
    stack = start_stack(a, port, wport)
    try:
        doc = soak_stack(a, gateway, workers, stack_processes(stack.pid, wport))
    finally:
        stack.send_signal(signal.SIGTERM)
        try:
            stack.wait(120)
        except subprocess.TimeoutExpired:
            stack.kill()
    (out / "soak.json").write_text(json.dumps(doc, indent=1))
    plot(doc, out / "soak.png")
    v = doc["verdict"]
    print(f"soak {v['soak_seconds']:.0f}s at {v['rate_rps']:.2f} req/s ({a.load:.0%} of {v['capacity_rps']:.2f}): "
          f"{v['requests']} requests, {v['complete']} complete, {v['errors']} errors, {v['requests_lost']} lost; "
          f"RSS growth max {v['rss_growth_pct']:.2f}%, fd growth max {v['fd_growth']}; "
          f"checks {v['checks']} -> {out / 'soak.json'}")
    return 0 if v["passed"] else 1


if __name__ == "__main__":
    # Redraw the plot of a finished run:  python -m loadtest.soak results/reliability/soak.json
    path = Path(sys.argv[1])
    plot(json.loads(path.read_text()), path.with_suffix(".png"))
