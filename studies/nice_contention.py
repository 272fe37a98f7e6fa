"""Why side work runs at nice 10 (issue 47): a decode-like step beside a busy thread, at two priorities.

A stand-in for one decode step at batch 1 (60 small float32 GEMVs, SmolLM2's widths, on every
core torch uses) is timed alone, beside a process that spins on one core at nice 0, and beside
the same process at nice 10 (``swiftcommon.priority.BACKGROUND_NICE``), in this process's
default OpenMP wait policy and with ``OMP_WAIT_POLICY=PASSIVE`` (a child run). On a machine
whose every core runs the engine's threads, the spinning process takes a core from one of them
and the others wait for it at each parallel region; at nice 10 the scheduler hands the core
back at once.

    python -m studies.nice_contention --out results/reliability/nice_contention.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from benchmarks.lib.records import command_line, write_json


def measure(steps: int) -> dict:
    import torch

    from swiftcommon.priority import BACKGROUND_NICE

    torch.manual_seed(0)
    square = [torch.randn(576, 576) for _ in range(30)]
    wide = [torch.randn(576, 1536) for _ in range(30)]
    x0 = torch.randn(1, 576)

    def step():
        x = x0
        for a, b in zip(square, wide):
            x = torch.nn.functional.linear(x, a)
            x = torch.nn.functional.linear(torch.nn.functional.linear(x, b.T).relu(), b)
            x = x / (x.norm() + 1)

    def timed() -> dict:
        ts = []
        for _ in range(steps):
            t = time.perf_counter()
            step()
            ts.append(time.perf_counter() - t)
        return {"median_ms": round(1e3 * statistics.median(ts), 3), "max_ms": round(1e3 * max(ts), 1)}

    for _ in range(20):
        step()
    out = {"threads": torch.get_num_threads(), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"),
           "alone": timed()}
    for nice in (0, BACKGROUND_NICE):
        hog = subprocess.Popen([sys.executable, "-c", f"import os\nos.nice({nice})\nwhile True: pass"])
        time.sleep(0.3)
        try:
            out[f"beside_spinner_nice_{nice}"] = timed()
        finally:
            hog.kill()
            hog.wait()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        print(json.dumps(measure(a.steps)))
        return 0
    runs = []
    for policy in (None, "PASSIVE"):
        env = {**os.environ, **({"OMP_WAIT_POLICY": policy} if policy else {})}
        r = subprocess.run([sys.executable, "-m", "studies.nice_contention", "--out", a.out, "--steps", str(a.steps), "--child"], env=env,
                           capture_output=True, text=True, check=True)
        runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
        print(json.dumps(runs[-1]), flush=True)
    write_json(a.out, {"command": command_line(argv), "runs": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
