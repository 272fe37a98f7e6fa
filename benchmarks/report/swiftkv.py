"""results/swiftkv/summary.json and the trade-off plot, from two measured files only.

* quality: JSON files of ``modelkit eval`` (labels ``l{l}_g{g}``, e.g. ``l15_g1``) with the
  perplexity increase, KL, top-1 agreement and task accuracies (plus their 95%
  intervals); several files must share one setup and baseline (checked).
  ``task_accuracy_kept`` is the model's task accuracy relative to the original's over all
  items (the eval's ``task_accuracy_relative``); ``task_retention`` is the stricter share
  of the items the original solves that the model still solves (``task_accuracy``);
* speed: JSON files of ``benchmarks/engine/swiftkv_prefill.py`` with engines
  ``swiftkv l={l} g={g}``; ``prefill_time_ratio`` is the median per-round TTFT ratio
  against the baseline of the same run, averaged over the prompt lengths at which every
  variant was measured.

A variant missing from either file is an error: nothing is filled in by hand.

    python -m benchmarks report swiftkv --quality results/swiftkv/quality_l15.json results/swiftkv/quality_l22.json \\
        --prefill results/swiftkv/prefill_cpu.json results/swiftkv/prefill_cpu_l22.json --out results/swiftkv/summary.json
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

FIELDS = ("ppl_increase_pct", "task_accuracy_kept", "kl", "top1_agreement", "prefill_time_ratio")


def merge(qualities: list[dict], prefills: list[dict]) -> tuple[dict, dict]:
    """One quality dict (results of every file) and one prefill dict (rows of every file)."""
    first = next(iter(qualities[0]["results"].values()))
    for q in qualities[1:]:
        r = next(iter(q["results"].values()))
        if (r["setup"], r["ppl_baseline"], r["tasks_kept"]) != (first["setup"], first["ppl_baseline"],
                                                                  first["tasks_kept"]):
            raise SystemExit("quality files differ in setup or baseline; rerun them with the same arguments")
    quality = {"command": [q["command"] for q in qualities],
               "results": {k: v for q in qualities for k, v in q["results"].items()}}
    prefill = {"command": [p["command"] for p in prefills], "rows": [r for p in prefills for r in p["rows"]]}
    return quality, prefill


def summarise(quality: dict, prefill: dict) -> dict:
    shipped = {}
    labels = {lab: m for lab in quality["results"] if (m := re.fullmatch(r"l(\d+)_g(\d+)", lab))}
    lengths = [{row["prompt_tokens"] for row in prefill["rows"] if row["engine"] == f"swiftkv l={m[1]} g={m[2]}"}
               for m in labels.values()]
    common = set.intersection(*lengths) if lengths else set()
    for label, m in labels.items():
        r = quality["results"][label]
        ratios = [row["ratio_vs_baseline_median"] for row in prefill["rows"]
                  if row["engine"] == f"swiftkv l={m[1]} g={m[2]}" and row["prompt_tokens"] in common]
        if not ratios:
            raise SystemExit(f"{label}: no 'swiftkv l={m[1]} g={m[2]}' rows in the prefill benchmark at a prompt "
                             "length every variant was measured at")
        if r.get("task_accuracy_relative") is None or r.get("task_accuracy") is None:
            raise SystemExit(f"{label}: the quality file has no relative task accuracy (run a current "
                             "modelkit eval with tasks)")
        shipped[label] = {
            "ppl_increase_pct": r["ppl_increase_pct"], "task_accuracy_kept": r["task_accuracy_relative"],
            "kl": r["kl"], "top1_agreement": r["top1_agreement"], "prefill_time_ratio": statistics.mean(ratios),
            "task_retention": r["task_accuracy"],
            "ci95": {k: r.get(src + "_ci") for k, src in (("ppl_increase_pct", "ppl_increase_pct"),
                                                         ("task_accuracy_kept", "task_accuracy_relative"),
                                                         ("task_retention", "task_accuracy"),
                                                         ("kl", "kl"), ("top1_agreement", "top1_agreement"))},
            "tasks_kept": r["tasks_kept"], "model": r["model"]}
    if not shipped:
        raise SystemExit("no l{l}_g{g} labels in the quality file")
    first = next(iter(quality["results"].values()))
    return {"shipped": shipped,
            "original": {"ppl": first["ppl_baseline"], "tasks_solved": first["tasks_kept"],
                         "tasks_generated": first["tasks_total"]},
            "setup": first["setup"], "quality_command": quality["command"], "prefill_command": prefill["command"],
            "prefill_lengths": sorted(common)}


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, key, label in ((axes[0], "ppl_increase_pct", "perplexity increase through the cache (%)"),
                           (axes[1], "task_accuracy_kept", "task accuracy relative to the original's"),
                           (axes[2], "task_retention", "share of the original's solved items kept")):
        ax.scatter([1.0], [0.0 if key == "ppl_increase_pct" else 1.0], color="black")
        ax.annotate("original", (1.0, 0.0 if key == "ppl_increase_pct" else 1.0), textcoords="offset points",
                    xytext=(-20, 10))
        for i, (name, v) in enumerate(summary["shipped"].items()):
            ci = v["ci95"].get(key)
            err = [[v[key] - ci[0]], [ci[1] - v[key]]] if ci else None
            ax.errorbar([v["prefill_time_ratio"]], [v[key]], yerr=err, fmt="o", capsize=4)
            # alternate label sides: neighbouring variants sit close together
            ax.annotate(name, (v["prefill_time_ratio"], v[key]), textcoords="offset points",
                        xytext=(6, 4) if i % 2 == 0 else (-40, -14))
        ax.set_xlabel("prefill time / original's (engine benchmark, CPU)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_yscale("symlog", linthresh=10)
    fig.suptitle("SwiftKV SmolLM2-135M variants: prefill saving vs quality (95% intervals)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--quality", required=True, nargs="+")
    ap.add_argument("--prefill", required=True, nargs="+")
    ap.add_argument("--out", required=True, help="summary JSON; the plot is written next to it (.png)")


def main(args: argparse.Namespace) -> int:
    summary = summarise(*merge([json.loads(Path(p).read_text()) for p in args.quality],
                               [json.loads(Path(p).read_text()) for p in args.prefill]))
    out = Path(args.out)
    out.write_text(json.dumps(summary, indent=2))
    plot(summary, out.with_name("tradeoff.png"))
    print(json.dumps(summary["shipped"], indent=2))
    return 0
