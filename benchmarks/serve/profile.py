"""Where a served workload spends the worker's time, thread by thread (py-spy, sampled).

    python -m benchmarks serve profile --workload decode_128_128 --out results/perf/profiles/served_decode_128_128.json

Starts our worker (defaults), warms it up, then runs the workload with perf_suite's client
while ``py-spy record`` (started 1 s before the workload, to attach) samples every thread
of the worker (``--rate`` Hz for ``--seconds``). Idle threads are not sampled, so a
thread's share is the fraction of samples in which it was running, not blocked on a lock,
the GIL or I/O. Writes the per-thread active shares,
each thread's top frames and the workload's figures.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.lib.records import write_json
from benchmarks.lib.profiling import py_spy
from benchmarks.lib.workloads import SERVING as WORKLOADS
from benchmarks.serve.suite import SERVED, run_workload, start, stop


def summarise(raw: Path, samples: int, top: int = 8) -> dict:
    """py-spy raw output (``thread;frame;...;frame count`` lines) -> per-thread shares and top frames."""
    per_thread: collections.Counter = collections.Counter()
    frames: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for line in raw.read_text().splitlines():
        if not line.strip():
            continue
        stack, n = line.rsplit(" ", 1)
        parts = stack.split(";")
        name = parts[0].split(": ", 1)[-1]
        per_thread[name] += int(n)
        frames[name][parts[-1]] += int(n)
    return {name: {"active_share": n / samples, "top_frames": dict(frames[name].most_common(top))}
            for name, n in per_thread.most_common()}


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="decode_128_128")
    ap.add_argument("--seconds", type=int, default=20)
    ap.add_argument("--rate", type=int, default=50)
    ap.add_argument("--port", type=int, default=18432)
    ap.add_argument("--out", required=True)


def main(args: argparse.Namespace) -> int:
    from modelkit.models import resolve_model

    argv_w = [sys.executable, "-m", "worker", "--served-model-name", SERVED, "--max-model-len", "2048",
              "--model", str(resolve_model("default"))]
    with tempfile.TemporaryDirectory() as tmp:
        proc = start(argv_w, {}, args.port, Path(tmp) / "worker.log", 300)
        try:
            run_workload(args.port, args.workload, 0.25, seed=1000)                 # warm-up
            raw = Path(tmp) / "spy.txt"
            rec = py_spy(proc.pid, raw, args.seconds, "--threads", "--rate", str(args.rate))
            time.sleep(1)
            res = run_workload(args.port, args.workload, 1.0, seed=0)
            rec.wait(args.seconds + 60)
            threads = summarise(raw, args.seconds * args.rate)
        finally:
            stop(proc)
    metric = WORKLOADS[args.workload][4]
    out = {"command": args.command,
           "workload": args.workload, metric: res[metric], "duration_s": res.get("duration"),
           "samples_per_thread_max": args.seconds * args.rate, "threads": threads}
    write_json(args.out, out)
    print(json.dumps({k: v for k, v in out.items() if k != "threads"}))
    for name, t in threads.items():
        print(f"{t['active_share']:6.1%}  {name}")
    return 0
