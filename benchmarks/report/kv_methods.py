"""Build results/kv_methods/ (quality-vs-memory tables, plot, summary.json) from measured runs.

Reads the JSON written by ``modelkit eval`` sweeps (``--kv-methods`` lists of method objects)
and by ``benchmarks/engine/kv_pressure.py``; computes nothing new about the models, only collects:

- a configuration is named by its methods in role order (``zack+zipcache``) and its swept
  options; ``--pick NAME=OPTIONS`` chooses the setting that represents ``NAME`` in
  ``summary.json`` (``OPTIONS`` as ``method.option=value`` pairs joined by ``,``, options at
  their defaults left out: ``zipcache=`` is ZipCache with its defaults);
- bytes ratios are against a 16-bit cache of the same model with no KV method (planned,
  torch-free, as the engine sizes its pool): device and host bytes per token of the
  configuration at a 16-bit compute dtype over the plain model's. For eviction (same bytes
  per stored entry) the ratios are per prompt token: multiplied by the fraction of prompt
  entries kept over the evicted requests (budget / their mean prompt length, from the
  method's own counters);
- quality = baseline perplexity / perplexity, both through the cache; ``ppl_increase_pct``
  and ``task_accuracy_kept`` (share of the task items the uncompressed model solves that
  the configuration still solves) are copied from the sweep;
- ``zack_zipcache_combined_rate_at_99pct``: the highest combined compression rate
  (1 - device ratio) among the ZACK x ZipCache settings whose quality is >= 0.99 in every
  SmolLM2 sweep that ran them (short, and long prompts where run; 0.0 when none is);
- ``max_concurrency_ratio_best``: the best configuration's peak concurrent sequences over
  the baseline's in the memory-pressure run (same pool bytes).

    python -m benchmarks report kv_methods --short S.json --long L.json --swiftkv W.json \\
        --pressure P.json --pick kcache=kcache.top_n=64 ... --out results/kv_methods
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROLE_ORDER = ("zack", "fp8", "zipcache", "kcache", "eviction")

# Properties of the code that a test proves rather than a run measures (issue 32): they go into
# the method's entry of summary.json with its figures. kcache: the host pool is bounded by
# --kv-host-memory-gb (tests/refengine/kv/test_kcache_host_bound.py).
CHECKED = {"kcache": {"host_bytes_bounded": True}}


def name_of(methods: dict) -> str:
    return "+".join(m for m in ROLE_ORDER if m in methods) or "none"


def options_of(methods: dict) -> str:
    """``method.option=value`` pairs of the options a sweep set to other values than the method's
    defaults (calibration paths left out); "" = every method at its defaults."""
    from refengine.kv.registry import METHODS

    def default(m, k):
        return METHODS[m].OptionsModel.model_fields[k].default

    return ",".join(f"{m}.{k}={v}" for m in ROLE_ORDER if m in methods
                    for k, v in sorted((methods[m] or {}).items()) if k != "calibration" and v != default(m, k))


def plain_16bit(model: str, swiftkv: bool = True) -> float:
    from refengine.kv import registry

    facts = registry.facts_for(model, swiftkv, elem_bytes=2)
    return registry.plan([], facts).device_bytes_per_token


def rows(paths) -> list[dict]:
    """One row per configuration of the sweep files (a path or a list of paths)."""
    out = []
    for path in ([paths] if isinstance(paths, str) else paths or []):
        out += _rows(json.loads(Path(path).read_text()))
    return out


def _rows(data: dict) -> list[dict]:
    out = []
    for label, r in data["results"].items():
        methods = r["overrides"].get("kv_methods") or {}
        base16 = plain_16bit(r["model"])
        dev = r["kv_bytes_per_token_16bit"] / base16
        st = r.get("kv_method_stats") or {}
        kept = 1.0
        if st.get("eviction_requests"):
            budget = st["eviction_budget"]
            kept = budget / (budget + st["eviction_tokens_evicted"] / st["eviction_requests"])
        out.append({"label": label, "name": name_of(methods), "options": options_of(methods),
                    "command": data.get("command"), "device_ratio": dev * kept, "device_ratio_per_entry": dev,
                    "host_ratio": r["kv_host_bytes_per_token_16bit"] / base16 * kept, "kept_fraction": kept,
                    "quality": r["ppl_baseline"] / r["ppl"] if r.get("ppl") else None,
                    "ppl_increase_pct": r.get("ppl_increase_pct"), "top1": r.get("top1_agreement"),
                    "greedy": r.get("greedy_token_agreement"), "tasks": r.get("task_accuracy"),
                    "needle": r.get("needle_accuracy"), "needles_kept": r.get("needles_kept"),
                    "setup": r.get("setup", {})})
    return out


def fmt(v, spec: str) -> str:
    return "n/a" if v is None else format(v, spec)


def table(title: str, rs: list[dict]) -> list[str]:
    if not rs:
        return []
    cmds = list(dict.fromkeys(r["command"] for r in rs))
    lines = [f"### {title}\n", *(f"Command: `{c}`\n" for c in cmds),
             "| configuration | options | device B/token vs 16-bit | host vs 16-bit | ppl increase | quality | "
             "top-1 | greedy tokens | tasks kept | needle |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rs:
        lines.append(f"| {r['name']} | {r['options'] or 'defaults'} | {r['device_ratio']:.3f} | {r['host_ratio']:.3f} | "
                     f"{fmt(r['ppl_increase_pct'], '+.2f')}% | {fmt(r['quality'], '.4f')} | {fmt(r['top1'], '.1%')} | "
                     f"{fmt(r['greedy'], '.1%')} | {fmt(r['tasks'], '.1%')} | {fmt(r['needle'], '.1%')} |")
    return lines + [""]


def plot(out: Path, sweeps: dict[str, list[dict]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.8))
    marks = {"kcache": "^", "zipcache": "s", "eviction": "v", "zack+zipcache": "D", "zack+eviction": "P",
             "kcache+eviction": "X", "zack+kcache": "*"}
    for (title, rs), color in zip(sweeps.items(), ("C0", "C1", "C2", "C3")):
        for r in rs:
            if r["quality"] is None:
                continue
            ax.scatter(r["device_ratio"], r["quality"], marker=marks.get(r["name"], "o"), color=color, s=36)
            ax.annotate(f"{r['name']} {r['options']}".replace("zipcache.", "").replace("kcache.", "")
                        .replace("eviction.", "").replace("zack.", ""), (r["device_ratio"], r["quality"]),
                        fontsize=5, alpha=0.8)
        ax.scatter([], [], color=color, label=title)
    ax.axhline(0.99, color="grey", ls=":", label="99% of baseline")
    ax.set_xlabel("device KV bytes per token / 16-bit cache (eviction: per prompt token)")
    ax.set_ylabel("baseline ppl / ppl (through the cache)")
    ax.set_xscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "quality_vs_memory.png", dpi=130)


def bytes_table(pressure: dict) -> list[str]:
    """Planned bytes per token (16-bit compute dtype, as the pool is sized) of the memory-pressure
    configurations, over the plain model's 16-bit cache. Torch-free planning: no model loads."""
    from modelkit.evaluate import bytes_16bit

    base = plain_16bit(pressure["model"])
    lines = ["### Bytes per token of each configuration (16-bit compute dtype, planned = allocated)\n",
             "| configuration | device B/token | host B/token | device / 16-bit | host / 16-bit |",
             "|---|---:|---:|---:|---:|"]
    for name, r in pressure["results"].items():
        dev, host = bytes_16bit(Path(pressure["model"]), {"kv_methods": r["methods"]})
        lines.append(f"| {name} | {dev:.1f} | {host:.1f} | {dev / base:.3f} | {host / base:.3f} |")
    return lines + ["", "Eviction keeps the bytes per stored entry and frees the entries past `budget` "
                        "after the prompt (see the quality tables for its ratio per prompt token).", ""]


def plot_pressure(out: Path, pressure: dict) -> None:
    """Peak concurrent sequences per configuration at the same device KV budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(pressure["results"])
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.bar(names, [pressure["results"][n]["peak_concurrent"] for n in names], color="C0")
    ax.axhline(pressure["setup"]["requests"], color="grey", ls=":", label="all requests (the cap)")
    ax.set_ylabel("peak concurrent sequences")
    ax.set_title(f"same {pressure['setup']['pool_mb']:.0f} MiB device KV budget", fontsize=9)
    ax.tick_params(axis="x", labelsize=7, rotation=20)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "pressure_concurrency.png", dpi=130)


def pick(rs: list[dict], name: str, options: str) -> dict | None:
    for r in rs:
        if r["name"] == name and r["options"] == options:
            return r
    return None


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--short", action="append", default=[],
                    help="SmolLM2 sweep(s), short prompts (the summary's figures); repeatable")
    ap.add_argument("--long", default=None, help="SmolLM2 sweep, >= 2K-token prompts")
    ap.add_argument("--needle", default=None, help="needle-in-a-haystack sweep")
    ap.add_argument("--swiftkv", default=None, help="sweep on the distilled SwiftKV model")
    ap.add_argument("--pressure", default=None, help="benchmarks/engine/kv_pressure.py JSON")
    ap.add_argument("--pick", action="append", default=[], metavar="NAME=OPTIONS")
    ap.add_argument("--out", required=True)


def main(args: argparse.Namespace) -> int:
    out = Path(args.out)
    short, long, needle, swift = rows(args.short), rows(args.long), rows(args.needle), rows(args.swiftkv)

    methods = {}
    for p in args.pick:
        name, opts = p.split("=", 1)
        r = pick(short, name, opts)
        if r is None:                    # not measured (e.g. a sweep stopped early): left out, said so
            print(f"kv_methods_report: --pick {p}: not in {', '.join(args.short)}; left out", file=sys.stderr)
            continue
        methods[name] = {"device_bytes_per_token_ratio": r["device_ratio"], "host_bytes_per_token_ratio": r["host_ratio"],
                         "ppl_increase_pct": r["ppl_increase_pct"], "task_accuracy_kept": r["tasks"]}
    for name, checked in CHECKED.items():           # properties a test proves, kept beside the measured figures
        if name in methods:
            methods[name].update(checked)
    # combined rate at 99%: ZACK x ZipCache settings, quality >= 0.99 in every SmolLM2 sweep that ran them
    measured = [r for r in short if r["name"] == "zack+zipcache" and r["quality"] is not None]
    best = 0.0 if measured else None                 # None: no ZACK x ZipCache setting was measured
    for r in measured:
        others = [o for o in long if o["name"] == r["name"] and o["options"] == r["options"]
                  and o["quality"] is not None]
        if all(q >= 0.99 for q in [r["quality"]] + [o["quality"] for o in others]):
            best = max(best, 1 - r["device_ratio"])
    summary = {"methods": methods, "max_concurrency_ratio_best": None, "zack_zipcache_combined_rate_at_99pct": best}
    if args.pressure:
        pressure = json.loads(Path(args.pressure).read_text())
        ratios = [r["concurrency_ratio"] for i, r in enumerate(pressure["results"].values()) if i > 0]
        summary["max_concurrency_ratio_best"] = max(ratios)
        plot_pressure(out, pressure)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")

    cmd = args.command
    md = ["# KV methods: quality vs memory\n", f"Built by `{cmd}`.\n",
          "Bytes are per token against a 16-bit cache of the same model with no KV method (eviction: per prompt "
          "token, i.e. times the fraction of prompt entries kept). Quality = baseline perplexity / perplexity, both "
          "scored through the cache (prefix prefilled, continuation decoded token by token). Tasks kept: share of "
          "the task items the uncompressed model solves that the configuration still solves.\n"]
    if args.pressure:
        md += bytes_table(pressure)
    for title, rs in (("SmolLM2-135M-Instruct, 256-token prefixes", short),
                      ("SmolLM2-135M-Instruct, 2048-token prefixes (joined held-out passages)", long),
                      ("Needle in a haystack (SmolLM2-135M-Instruct)", needle),
                      ("Distilled SwiftKV SmolLM2 (l=15), baseline = the same model uncompressed", swift)):
        md += table(title, rs)
    (out / "quality.md").write_text("\n".join(md) + "\n")
    plot(out, {t: s for t, s in (("SmolLM2, 256-token prefixes", short), ("SmolLM2, 2048-token prefixes", long),
                                 ("SwiftKV SmolLM2", swift)) if s})
    print(json.dumps(summary, indent=2))
    return 0
