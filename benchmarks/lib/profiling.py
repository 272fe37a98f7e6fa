"""What a benchmark measures besides its own figures: CPU seconds of processes and their trees
(``psutil``), and ``py-spy`` sampling of a running process.

``cpu_seconds(root)``: per process of ``root``'s tree, its user + system seconds so far;
``tree_cpu_seconds(procs)``: the same summed over several trees; ``process_cpu_seconds(pid)``: one process. ``py_spy(pid, out, seconds, *flags)``
starts ``py-spy record`` (installed beside this interpreter) on ``pid`` in raw (collapsed) format and
returns the process; the caller runs its load meanwhile and waits for it. ``torch_ops(fn)``: the
operators torch's profiler saw while ``fn()`` ran, in process.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def cpu_seconds(root) -> dict[str, float]:
    """CPU seconds so far (user + system) of the psutil process ``root`` and its descendants,
    keyed 'pid name' (processes gone meanwhile are left out)."""
    import psutil

    out = {}
    for p in [root, *root.children(recursive=True)]:
        try:
            t = p.cpu_times()
            out[f"{p.pid} {p.name()}"] = t.user + t.system
        except psutil.Error:
            continue
    return out


def tree_cpu_seconds(procs) -> float:
    """CPU seconds of every process in the servers' trees (``cpu_seconds`` summed; gone ones count 0)."""
    import psutil

    total = 0.0
    for proc in procs:
        try:
            total += sum(cpu_seconds(psutil.Process(proc.pid)).values())
        except psutil.Error:
            continue
    return total


def process_cpu_seconds(pid: int) -> float:
    """User + system seconds so far of the one process ``pid`` (not its children)."""
    import psutil

    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def torch_ops(fn):
    """``fn()`` under torch's CPU profiler: (its result, the profiler's per-operator ``key_averages()``)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        result = fn()
    return result, prof.key_averages()


def py_spy(pid: int, out: Path, seconds: float, *flags: str) -> subprocess.Popen:
    """``py-spy record`` of ``pid`` for ``seconds`` into ``out`` (raw format; ``flags``: e.g. ``--threads``)."""
    spy = str(Path(sys.executable).parent / "py-spy")
    return subprocess.Popen([spy, "record", "--pid", str(pid), "--output", str(out), "--format", "raw",
                             "--duration", str(int(seconds)), *flags],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
