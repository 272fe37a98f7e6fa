"""The engine's OpenMP spin against a busy core: a normal chat's latency alone and beside one spinning process.

    PYTHONPATH=$PWD python -m studies.omp_spin [--settings 300000,2000,...] [--chats 15] [--out FILE]

For each setting (a ``GOMP_SPINCOUNT`` value, or ``passive`` for ``OMP_WAIT_POLICY=PASSIVE``), starts
the stack of ``benchmarks/serve/hostile.py`` (``swiftserve up --workers 1``, SmolLM2) with it in the
environment (the engine process keeps the user's value: ``refengine/omp_wait.py``), then times
``--chats`` normal chats (8 greedy tokens, one at a time) alone, beside one process spinning at nice
0, and beside one at nice 10. Prints the medians and maxima (ms) and writes them to ``--out``.
libgomp's default, when neither variable is set, is 300,000.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.lib.procs import free_port
from benchmarks.lib.records import command_line, write_json
from benchmarks.serve.hostile import NORMAL, Stack

SETTINGS = "300000,100000,20000,5000,2000,1000,300,100,passive"
SPIN = "while True: pass"


def chats(stack: Stack, n: int) -> dict:
    body = {"model": stack.model, **NORMAL}
    ms = []
    with httpx.Client(timeout=120) as c:
        for _ in range(n):
            t = time.monotonic()
            c.post(stack.gw + "/v1/chat/completions", json=body).raise_for_status()
            ms.append(1e3 * (time.monotonic() - t))
    return {"median_ms": round(statistics.median(ms), 1), "max_ms": round(max(ms), 1)}


def beside_spinner(stack: Stack, n: int, nice: int) -> dict:
    spinner = subprocess.Popen(["nice", "-n", str(nice), sys.executable, "-c", SPIN])
    try:
        time.sleep(0.5)
        return chats(stack, n)
    finally:
        spinner.kill()
        spinner.wait()


def one(setting: str, n: int) -> dict:
    env = {"OMP_WAIT_POLICY": "PASSIVE"} if setting == "passive" else {"GOMP_SPINCOUNT": setting}
    saved = {k: os.environ.get(k) for k in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    for k in saved:
        os.environ.pop(k, None)
    os.environ.update(env)
    try:
        base = free_port(2)
        stack = Stack(base, base + 1, Path(tempfile.gettempdir()) / f"omp-spin-{base}.log")
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    try:
        chats(stack, 5)                                      # warm-up
        row = {"setting": setting, "alone": chats(stack, n), "beside_nice0": beside_spinner(stack, n, 0),
               "beside_nice10": beside_spinner(stack, n, 10)}
    finally:
        stack.stop()
    print(f"{setting:>8}: alone {row['alone']['median_ms']:7.1f}  beside nice 0 {row['beside_nice0']['median_ms']:7.1f}"
          f"  nice 10 {row['beside_nice10']['median_ms']:7.1f}  (medians, ms)", flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--settings", default=SETTINGS, help="comma-separated GOMP_SPINCOUNT values or 'passive'")
    ap.add_argument("--chats", type=int, default=15, help="chats timed per condition")
    ap.add_argument("--out", type=Path, help="JSON record of the run")
    args = ap.parse_args()
    load = [round(os.getloadavg()[0], 2)]
    rows = [one(s, args.chats) for s in args.settings.split(",")]
    load.append(round(os.getloadavg()[0], 2))
    print(f"1-minute load average before {load[0]}, after {load[1]}")
    if args.out:
        write_json(args.out, {"command": command_line(), "load_before_after": load, "rows": rows})


if __name__ == "__main__":
    main()
