"""Comparison of result files: a table, PNG plots vs request rate (one line per label),
and a small HTML page embedding them."""

from __future__ import annotations

import html
import json
from pathlib import Path

PLOTS = [("median_ttft_ms", "median TTFT (ms)"), ("p99_ttft_ms", "p99 TTFT (ms)"),
         ("median_tpot_ms", "median TPOT (ms)"), ("output_throughput", "output tokens/s"),
         ("total_token_throughput", "total tokens/s"), ("request_goodput", "goodput (req/s)"),
         ("median_normalized_latency_ms", "normalised latency (ms/token)")]
TABLE = [("request_rate", "rate"), ("achieved_request_rate", "achieved"), ("completed", "ok"), ("failed", "failed"),
         ("median_ttft_ms", "TTFT p50 ms"), ("p99_ttft_ms", "TTFT p99 ms"), ("median_tpot_ms", "TPOT p50 ms"),
         ("p99_tpot_ms", "TPOT p99 ms"), ("output_throughput", "out tok/s"), ("total_token_throughput", "tot tok/s"),
         ("request_goodput", "goodput"), ("median_normalized_latency_ms", "norm. lat. ms/tok")]


def load_results(paths: list[Path]) -> list[dict]:
    files: list[Path] = []
    for p in paths:
        files += sorted(p.glob("*.json")) if p.is_dir() else [p]
    out = []
    for f in files:
        d = json.loads(f.read_text())
        if "label" in d and "request_rate" in d:
            out.append(d)
    if not out:
        raise SystemExit("no result files found")
    return out


def _rate(d: dict) -> float:
    r = d["request_rate"]
    return float("inf") if r == "inf" else float(r)


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


def table(results: list[dict]) -> str:
    rows = sorted(results, key=lambda d: (d["label"], _rate(d)))
    head = "| label | " + " | ".join(h for _, h in TABLE) + " |"
    lines = [head, "|---|" + "---:|" * len(TABLE)]
    for d in rows:
        lines.append(f"| {d['label']} | " + " | ".join(_fmt(d.get(k)) for k, _ in TABLE) + " |")
    return "\n".join(lines)


def plots(results: list[dict], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    labels = sorted({d["label"] for d in results})
    paths = []
    for key, title in PLOTS:
        if not any(d.get(key) is not None for d in results):
            continue
        fig, ax = plt.subplots(figsize=(6, 4))
        for lab in labels:
            pts = sorted((_rate(d), d[key]) for d in results if d["label"] == lab and d.get(key) is not None
                         and _rate(d) != float("inf"))
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=lab)
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel(title)
        ax.set_title(title + " vs request rate")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        p = out_dir / f"{key}.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    return paths


def write_report(results: list[dict], out_dir: Path, command: str = "") -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    md = table(results)
    imgs = plots(results, out_dir)
    (out_dir / "table.md").write_text((f"Command: `{command}`\n\n" if command else "") + md + "\n")
    rows = "".join(f"<img src='{html.escape(p.name)}' style='max-width:48%'>" for p in imgs)
    trs = []
    for line in md.splitlines():
        if line.startswith("|---"):
            continue
        cells = [html.escape(c.strip()) for c in line.strip("|").split("|")]
        tag = "th" if not trs else "td"
        trs.append("<tr>" + "".join(f"<{tag}>{c}</{tag}>" for c in cells) + "</tr>")
    page = (f"<!doctype html><meta charset='utf-8'><title>Load test report</title>"
            f"<style>body{{font-family:sans-serif}}td,th{{padding:2px 8px;text-align:right}}</style>"
            f"<h1>Load test report</h1><p><code>{html.escape(command)}</code></p>"
            f"<table border=1 cellspacing=0>{''.join(trs)}</table>{rows}")
    p = out_dir / "report.html"
    p.write_text(page)
    return p
