"""ZipCache's memory-quality curve from ``modelkit eval`` sweeps (issue 32, item 4).

    python -m benchmarks report zipcache_curve --short results/kv_methods/zipcache_curve_bs*.json \
        --long results/kv_methods/zipcache_curve_long.json --tasks results/kv_methods/zipcache_curve_tasks.json \
        --out results/kv_methods/zipcache_curve

Every ZipCache configuration of the sweep files becomes one row (matched across files by
block size and options): device bytes per token of the pool over a 16-bit cache of the
plain model (``pool``), the same with the full-precision staging area counted
(``+window``), and perplexity increase (with its 95% interval) at the short and long
prefixes, and task accuracy kept, where those runs exist.

Counting the window honestly: ZipCache keeps the newest tokens (``window``, plus the
block being filled) in full precision in a staging area outside the pool, allocated once
for ``max_num_seqs`` sequences (``ZipCacheMethod.reserved_bytes``). ``+window at L`` adds
that whole allocation, shared over ``max_num_seqs`` sequences of ``L`` tokens each (the
pool full of requests of that length), to the pool's bytes per token.

Writes ``OUT.json``, ``OUT.md`` (table and commands) and ``OUT.png`` (ppl increase vs bytes).
``--summary PATH --pick BLOCK,SALIENT`` merges that row into ``methods.zipcache`` of a
``results/kv_methods/summary.json`` (``device_bytes_per_token_ratio`` = the pool's,
``device_bytes_ratio_with_window_2048``, ``ppl_increase_pct`` at the short prefixes,
``task_accuracy_kept``), keeping every other key.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.lib.records import UsageError, write_json
from benchmarks.report.kv_methods import plain_16bit


def zip_options(r: dict) -> dict:
    """The ZipCache options of one result with the method's defaults filled in."""
    from refengine.kv.methods.zipcache.method import ZipCacheOptions

    return ZipCacheOptions(**((r["overrides"].get("kv_methods") or {}).get("zipcache") or {})).model_dump()


def key_of(r: dict) -> tuple:
    from refengine.kv.registry import default_block_size

    o, ov = zip_options(r), r["overrides"]
    bs = ov.get("block_size") or default_block_size(ov.get("kv_methods"))     # what the engine served with
    return (bs, o["bits_hi"], o["bits_lo"], o["salient_ratio"], o["window"])


def staging_share(model: str, key: tuple, contexts: list[int], max_num_seqs: int, batched: int) -> dict:
    """16-bit-cache fractions the staging area adds per token at each context length."""
    from refengine.kv import registry
    from refengine.kv.spec import EngineLimits

    bs, hi, lo, ratio, window = key
    opts = {"bits_hi": hi, "bits_lo": lo, "salient_ratio": ratio, "window": window}
    kv = registry.validate({"zipcache": opts}, registry.facts_for(model, elem_bytes=2, block_size=bs))
    limits = EngineLimits(bs, max_num_seqs, batched)
    reserved = sum(m.reserved_bytes(kv.spec, limits) for m in kv.methods)
    base16 = plain_16bit(model)
    return {str(n): reserved / (max_num_seqs * n * base16) for n in contexts}


def collect(paths: list[str]) -> dict[tuple, dict]:
    out = {}
    for path in paths:
        data = json.loads(Path(path).read_text())
        for r in data["results"].values():
            if "zipcache" in (r["overrides"].get("kv_methods") or {}):
                out[key_of(r)] = {**r, "command": data.get("command")}
    return out


def build(short: list[str], long: list[str], tasks: list[str], contexts: list[int],
          max_num_seqs: int, batched: int) -> list[dict]:
    s, lg, t = collect(short), collect(long), collect(tasks)
    rows = []
    for key in sorted(set(s) | set(lg) | set(t)):
        any_r = s.get(key) or lg.get(key) or t.get(key)
        pool = any_r["kv_bytes_per_token_16bit"] / plain_16bit(any_r["model"])
        share = staging_share(any_r["model"], key, contexts, max_num_seqs, batched)
        row = {"block_size": key[0], "bits_hi": key[1], "bits_lo": key[2], "salient_ratio": key[3],
               "window": key[4], "pool_ratio": pool, "with_window": {n: pool + v for n, v in share.items()}}
        for name, src in (("short", s), ("long", lg)):
            r = src.get(key)
            if r:
                row[name] = {"prefix": r["setup"]["prefix_tokens"], "ppl_increase_pct": r["ppl_increase_pct"],
                             "ci": r["ppl_increase_pct_ci"], "top1": r["top1_agreement"]}
        if key in t and t[key].get("task_accuracy") is not None:
            # kept: the share of the items the original solves that this configuration still solves
            # (summary.json's task_accuracy_kept); relative: its accuracy over the original's, all items
            row["task_accuracy_kept"], row["task_ci"] = t[key]["task_accuracy"], t[key]["task_accuracy_ci"]
            row["task_accuracy_relative"] = t[key]["task_accuracy_relative"]
            row["task_items"] = t[key]["tasks_total"]
        rows.append(row)
    return rows


def _ppl(row: dict, which: str) -> str:
    r = row.get(which)
    return "n/a" if not r else f"{r['ppl_increase_pct']:+.2f}% [{r['ci'][0]:+.2f}, {r['ci'][1]:+.2f}]"


def markdown(rows: list[dict], contexts: list[int], commands: list[str]) -> str:
    cols = [f"+window at {n}" for n in contexts]
    head = ["block", "bits hi/lo", "salient", "window", "pool", *cols, "ppl (short)", "ppl (long)", "tasks kept"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for r in rows:
        tk = "n/a" if "task_accuracy_kept" not in r else \
            (f"{r['task_accuracy_kept']:.3f} [{r['task_ci'][0]:.3f}, {r['task_ci'][1]:.3f}] "
             f"({r['task_items']} items; relative {r['task_accuracy_relative']:.3f})")
        lines.append("| " + " | ".join([str(r["block_size"]), f"{r['bits_hi']}/{r['bits_lo']}", f"{r['salient_ratio']:g}",
                                        str(r["window"]), f"{r['pool_ratio']:.3f}",
                                        *[f"{r['with_window'][str(n)]:.3f}" for n in contexts],
                                        _ppl(r, "short"), _ppl(r, "long"), tk]) + " |")
    return "\n".join(["Commands:", "", *[f"- `{c}`" for c in commands], "", *lines, ""])


def plot(path: Path, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for bs in sorted({r["block_size"] for r in rows}):
        pts = sorted((r["pool_ratio"], r["short"]["ppl_increase_pct"], r["salient_ratio"])
                     for r in rows if r["block_size"] == bs and "short" in r and r["window"] == 32)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=f"block {bs}")
            for x, y, sr in pts:
                ax.annotate(f"{sr:g}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.axvline(0.25, color="grey", ls=":", lw=1)
    ax.axhline(5.0, color="grey", ls=":", lw=1)
    ax.set_xlabel("device bytes per token / 16-bit cache (pool)")
    ax.set_ylabel("perplexity increase through the cache, % (short prefixes)")
    ax.set_title("ZipCache 4/2-bit: salient share (labels) and block size")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--short", nargs="+", required=True, help="eval JSONs at short prefixes")
    ap.add_argument("--long", nargs="*", default=[], help="eval JSONs at long prefixes (--join-docs)")
    ap.add_argument("--tasks", nargs="*", default=[], help="eval JSONs with the task suite")
    ap.add_argument("--contexts", nargs="+", type=int, default=[256, 2048])
    ap.add_argument("--max-num-seqs", type=int, default=64, help="the engine's (sizes the staging area)")
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--out", required=True, help="output path without extension")
    ap.add_argument("--summary", default=None, help="summary.json to merge the --pick row into")
    ap.add_argument("--pick", default=None, metavar="BLOCK,SALIENT", help="the row --summary reports, e.g. 32,0.375")


def main(args: argparse.Namespace) -> int:
    if bool(args.summary) != bool(args.pick):
        raise UsageError("--summary and --pick go together")
    rows = build(args.short, args.long, args.tasks, args.contexts, args.max_num_seqs, args.max_num_batched_tokens)
    if not rows:
        raise UsageError("no ZipCache configuration in the given files")
    commands = [json.loads(Path(p).read_text()).get("command") for p in [*args.short, *args.long, *args.tasks]]
    out = Path(args.out)
    write_json(out.with_suffix(".json"), {"command": args.command, "rows": rows,
                                          "max_num_seqs": args.max_num_seqs})
    out.with_suffix(".md").write_text(f"`{args.command}`\n\n" + markdown(rows, args.contexts, commands))
    plot(out.with_suffix(".png"), rows)
    print(markdown(rows, args.contexts, []))
    if args.summary:
        merge_summary(Path(args.summary), rows, args.pick)
    return 0


def merge_summary(path: Path, rows: list[dict], pick: str) -> None:
    bs, _, ratio = pick.partition(",")
    row = next((r for r in rows if r["block_size"] == int(bs) and r["salient_ratio"] == float(ratio)
                and r["window"] == 32 and (r["bits_hi"], r["bits_lo"]) == (4, 2)), None)
    if row is None or "short" not in row:
        raise UsageError(f"--pick {pick}: no 4/2-bit, window-32 row with short-prefix perplexity")
    doc = json.loads(path.read_text()) if path.exists() else {}
    entry = doc.setdefault("methods", {}).setdefault("zipcache", {})
    entry.update({"device_bytes_per_token_ratio": row["pool_ratio"],
                  "device_bytes_ratio_with_window_2048": row["with_window"].get("2048"),
                  "ppl_increase_pct": row["short"]["ppl_increase_pct"],
                  "task_accuracy_kept": row.get("task_accuracy_kept")})
    path.write_text(json.dumps(doc, indent=2) + "\n")
