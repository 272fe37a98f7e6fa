"""Build results/zack/ (quality table, plots, summary.json) from the sweep and speed results.

Reads the JSON files written by ``modelkit eval`` sweeps (labels ``NAME[zack.rate=R,zack.mode=M]``)
and by ``benchmarks/kernel/zack_attention.py``; computes nothing new about the models, only collects:

- quality = baseline perplexity / perplexity, both scored through the compressed cache (1.0 =
  no loss); the "rate at 99%" of a setting: going up the short-prompt sweep's rates, the last one
  whose quality is >= 0.99 there and in every other sweep that measured it (long prompts) before
  the first miss; 0.0 when even the smallest rate misses;
- the same with task accuracy (items the uncompressed model solves) for comparison.

    python -m benchmarks report zack --sweep results/zack/sweep_smollm2.json --long results/zack/sweep_long.json \
        --stacked results/zack/sweep_smollm2_stacked.json --swiftkv results/zack/sweep_swiftkv.json \
        --speed results/zack/speed.json --out results/zack      (results/zack/run.sh runs everything)
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

LABEL = re.compile(r"^(?P<name>[^\[]+)\[zack\.rate=(?P<rate>[0-9.]+),zack\.mode=(?P<mode>\w+)\]$")


def load(paths: list[str] | str | None) -> dict:
    """{(name, mode): {rate: result}} of one or more sweep files of the same model and items."""
    paths = [paths] if isinstance(paths, str) else list(paths or [])
    if not paths:
        return {}
    out: dict = {}
    commands = []
    for path in paths:
        data = json.loads(Path(path).read_text())
        commands.append(data.get("command"))
        for label, res in data["results"].items():
            m = LABEL.match(label)
            if m:
                out.setdefault((m["name"], m["mode"]), {})[float(m["rate"])] = res
    return {"commands": commands, "series": out}


def quality(res: dict) -> float:
    return res["ppl_baseline"] / res["ppl"]


def rate_at(series_list: list[dict], key, threshold: float = 0.99) -> float:
    """Highest rate of the first series, going up from the smallest, whose quality (``key(res)``, None =
    not measured) is >= threshold in every series that measured it; the first miss ends the run."""
    best = 0.0
    for r in sorted(series_list[0]):
        vals = [key(s[r]) for s in series_list if r in s and key(s[r]) is not None]
        if vals and all(v >= threshold for v in vals):
            best = r
        elif vals:
            break
    return best


def table(title: str, sweep: dict) -> list[str]:
    lines = [f"### {title}\n", *[f"Command: `{c}`\n" for c in sweep["commands"]],
             "| basis | mode | rate (requested) | rate (achieved) | KV bytes/token | ppl | quality (ppl ratio) | "
             "top-1 agreement | greedy token agreement | task accuracy |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for (name, mode), rates in sorted(sweep["series"].items()):
        for r, res in sorted(rates.items()):
            achieved = 1 - res["kv_bytes_per_token"] / res["kv_bytes_per_token_baseline"]
            ga = res.get("greedy_token_agreement")
            ta = res.get("task_accuracy")
            lines.append(f"| {name} | {mode} | {r:.2f} | {achieved:.3f} | {res['kv_bytes_per_token']:.0f} | "
                         f"{res['ppl']:.3f} | {quality(res):.4f} | {res['top1_agreement']:.1%} | "
                         + ("n/a" if ga is None else f"{ga:.1%}") + " | " + ("n/a" if ta is None else f"{ta:.1%}")
                         + " |")
    return lines + [""]


def speed_table(path: Path) -> list[str]:
    """The attention benchmark's own markdown table (written next to its JSON), under a heading."""
    md = path.with_suffix(".md")
    if not md.is_file():
        return []
    body = [line for line in md.read_text().strip().splitlines() if not line.startswith("# ")]
    return [f"### Attention time vs rate ({path.name})\n", *body, ""]


def plot(out: Path, sweeps: dict[str, dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for title, sweep in sweeps.items():
        for (name, mode), rates in sorted(sweep["series"].items()):
            rs = sorted(rates)
            ax.plot(rs, [quality(rates[r]) for r in rs], "o-" if mode == "adaptive" else "s--",
                    label=f"{title}: {name} {mode}")
    ax.axhline(0.99, color="grey", ls=":", label="99% of baseline")
    ax.set_xlabel("ZACK overall compression rate (fraction of K/V elements removed)")
    ax.set_ylabel("baseline ppl / ppl (through the cache)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "quality_vs_rate.png", dpi=120)


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--sweep", required=True, nargs="+", help="SmolLM2 sweeps (short prompts; several files merge)")
    ap.add_argument("--stacked", default=None, help="SmolLM2 sweep of the paper's stacked basis (short prompts)")
    ap.add_argument("--long", default=None, nargs="+", help="SmolLM2 sweeps with long (>= 2K-token) prompts")
    ap.add_argument("--swiftkv", default=None, help="sweep on the distilled SwiftKV model")
    ap.add_argument("--speed", default=None, help="benchmarks/kernel/zack_attention.py JSON")
    ap.add_argument("--more-speed", nargs="*", default=[], help="further zack_attention.py JSONs (other shapes)")
    ap.add_argument("--basis", default="whitened", help="the basis the summary reports (default: %(default)s)")
    ap.add_argument("--composes-with", nargs="+", default=["swiftkv", "acrosskv", "fp8"],
                    help="what the tests combine ZACK with (tests/refengine/kv/test_kv_methods_shared.py)")
    ap.add_argument("--out", required=True)


def main(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    short, long, swift, stacked = load(args.sweep), load(args.long), load(args.swiftkv), load(args.stacked)

    def series(sweep, mode):
        return sweep["series"].get((args.basis, mode)) if sweep else None

    summary: dict = {}
    for mode in ("adaptive", "uniform"):
        ss = [s for s in (series(short, mode), series(long, mode)) if s]
        summary[f"{mode}_rate_at_99pct"] = rate_at(ss, quality)
        summary[f"{mode}_rate_at_99pct_tasks"] = rate_at(
            [series(short, mode)], lambda r: r.get("task_accuracy"))
        if swift and series(swift, mode):
            summary[f"swiftkv_{mode}_rate_at_99pct"] = rate_at([series(swift, mode)], quality)
    half = series(short, "adaptive").get(0.5)
    summary["kv_bytes_per_token_ratio_at_50pct"] = (half["kv_bytes_per_token"] / half["kv_bytes_per_token_baseline"]
                                                    if half else None)
    if args.speed:
        rows = json.loads(Path(args.speed).read_text())["rows"]
        dec = [r for r in rows if r["kind"] == "decode" and abs(r["rate"] - 0.5) < 1e-9]
        pre = [r for r in rows if r["kind"] == "prefill" and abs(r["rate"] - 0.5) < 1e-9]
        summary["decode_attention_time_ratio_at_50pct"] = dec[0]["ratio_vs_uncompressed"] if dec else None
        summary["prefill_attention_time_ratio_at_50pct"] = pre[0]["ratio_vs_uncompressed"] if pre else None
    if stacked:
        for mode in ("adaptive", "uniform"):
            ser = stacked["series"].get(("stacked", mode))
            if ser:
                summary[f"stacked_{mode}_rate_at_99pct"] = rate_at([ser], quality)
    summary["composes_with"] = list(args.composes_with)
    keys = ["adaptive_rate_at_99pct", "uniform_rate_at_99pct", "kv_bytes_per_token_ratio_at_50pct",
            "decode_attention_time_ratio_at_50pct", "composes_with"]
    (out / "summary.json").write_text(json.dumps({k: summary.get(k) for k in keys}, indent=2) + "\n")
    (out / "summary_details.json").write_text(json.dumps(summary, indent=2) + "\n")
    cmd = args.command
    md = ["# ZACK quality vs compression rate\n", f"Built by `{cmd}` from the sweeps below.\n",
          "Quality = baseline perplexity / perplexity, both scored through the cache (prefix prefilled, "
          "continuation decoded token by token, every read from the compressed cache). Rate at 99%: going up the "
          "short-prompt rates, the last one keeping quality >= 0.99 there and on long prompts where measured, "
          "before the first miss. Rate = fraction of K/V elements removed over the whole cache.\n",
          "```json", json.dumps(summary, indent=2), "```\n"]
    for title, sweep in (("SmolLM2-135M-Instruct, 256-token prefixes", short),
                         ("SmolLM2-135M-Instruct, the paper's stacked basis, 256-token prefixes", stacked),
                         ("SmolLM2-135M-Instruct, 2048-token prefixes (joined held-out passages)", long),
                         ("Distilled SwiftKV SmolLM2 (l=15), baseline = the same model uncompressed", swift)):
        if sweep:
            md += table(title, sweep)
    for speed in [args.speed, *args.more_speed]:
        md += speed_table(Path(speed))
    (out / "quality.md").write_text("\n".join(md) + "\n")
    plot(out, {t: s for t, s in (("short", short), ("paper basis", stacked), ("long", long), ("swiftkv", swift))
               if s})
    print(json.dumps({k: summary.get(k) for k in keys}, indent=2))
    return 0
