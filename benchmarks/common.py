"""What the benchmark scripts share: the command line that reproduces a result, writing the
result as a JSON file (parent directories created), the median time of a call, and running
one engine's half of a comparison in another interpreter (a child that prints ``RESULT <json>``)."""

from __future__ import annotations

import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path


def command_line(argv: list[str] | None = None) -> str:
    """``python <script> <args>`` as run (``argv``: the arguments main() was given, None = sys.argv)."""
    return "python " + shlex.join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])])


def write_json(path: str | Path, doc: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")


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


def add_attention_shape_args(ap) -> None:
    """One layer's attention shape (SmolLM2's by default) and the prefill/decode sizes, for kernel benchmarks."""
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--prefill-len", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--context", type=int, default=200)
