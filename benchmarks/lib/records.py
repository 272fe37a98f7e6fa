"""A benchmark's record: the command line that reproduces a result, writing the result as a JSON
file (parent directories created), the time of a call (``timed``, CUDA-synchronised) and its median, and running one engine's half of a
comparison in another interpreter (a child that prints ``RESULT <json>``); ``merge_json`` merges a
run's keys into a results folder's ``summary.json``.

``ROOT`` is the checkout the benchmarks run from (results/, checkpoints/, the venvs). A benchmark run
through ``benchmarks.cli`` finds its command line in ``args.command``; ``command_line()`` is for
the studies, run as ``python -m studies.<name>``. ``UsageError``: a benchmark's ``main`` raises it
for arguments that parse but do not go together; the CLI reports it as argparse reports its own.
"""

from __future__ import annotations

import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class UsageError(Exception):
    """Arguments that parse but do not go together (the CLI prints usage and exits with 2)."""


def command_line(argv: list[str] | None = None) -> str:
    """``python -m <module> <args>`` as run (``argv``: the arguments main() was given, None =
    sys.argv); ``python <script> <args>`` for a script run by its path."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    head = ["-m", spec.name.removesuffix(".__main__")] if spec is not None and spec.name else [sys.argv[0]]
    return "python " + shlex.join([*head, *(argv if argv is not None else sys.argv[1:])])


def bench_argv(concern: str, name: str) -> list[str]:
    """The interpreter arguments that run one benchmark (a child of a comparison runs itself so)."""
    return ["-m", "benchmarks", concern, name]


def write_json(path: str | Path, doc: dict, indent: int = 1) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=indent) + "\n")


def merge_json(path: str | Path, keys: dict, indent: int = 1) -> dict:
    """Merge ``keys`` into the JSON object at ``path`` (a results folder's ``summary.json``: keys
    this run produced replace the old ones, the others are kept); returns the merged object."""
    path = Path(path)
    old = json.loads(path.read_text()) if path.is_file() else {}
    doc = {**(old if isinstance(old, dict) else {}), **keys}
    write_json(path, doc, indent)
    return doc


def timed(fn) -> float:
    """Wall seconds of one ``fn()`` call, the CUDA queue drained before and after (where there is one)."""
    import torch

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def median_ms(fn, repeats: int, warmup: int = 1) -> float:
    """Median wall time of ``fn()`` in ms over ``repeats`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def run_child(name: str, argv: list[str], env: dict, cwd: Path) -> dict:
    """Run ``argv`` (a script in child mode) and return the JSON of its last ``RESULT `` line;
    exits with the child's stderr tail when it fails."""
    print(f"== {name}", flush=True)
    p = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    if p.returncode or not line:
        raise SystemExit(f"{name} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(line[-1][len("RESULT "):])
