"""ZACK by the paper's measure: the largest compression rate at which task accuracy stays at 99%.

    python -m studies.zack_task_search --corpus ~/.cache/swiftserve/corpus/smollm2-v2 \
        --out results/zack/task_search.json
    python -m studies.zack_task_search ... --with '{"zipcache": {}}' --modes adaptive   # ZACK x ZipCache

For each rank mode, a binary search over ``zack.rate`` in [0, --hi]: a rate passes when the
model's task accuracy relative to the original's (all items, ``modelkit eval``'s
``task_accuracy_relative``) is at least --target (0.99). The baseline is computed once
(``modelkit.evaluate.Evaluation``); each probe is one ``compare`` through the serving engine with
the KV methods on, so it also records perplexity through the cache, the KV bytes per token and
the paired-bootstrap 95% interval of the relative accuracy. Compression figures are
1 - (KV bytes a 16-bit cache of the probe's configuration stores) / (those of the uncompressed
model), as ``benchmarks/report/kv_methods.py`` counts them. The search assumes accuracy falls
with the rate; the point estimate decides, and the report says when the interval at the found
rate is too wide to tell 99% from the next probe (``resolved``), with the items a +-1% interval
would need (``items_for_1pct``: the binomial count at the observed accuracy).
``--with`` adds other KV methods to every probe (rate 0 then means "that method alone"); the
combined compression is 1 - KV bytes / a 16-bit cache's bytes.
Writes JSON (every probe) and a markdown table next to it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from benchmarks.lib.records import command_line


def probe(ev, model: Path, rate: float, mode: str, extra: dict, base16: float, sizes: dict) -> dict:
    methods = dict(extra)
    if rate > 0:
        methods["zack"] = {"rate": rate, "mode": mode}
    else:
        methods["zack"] = False             # rate 0: the ZACK model's rotations off (the uncompressed model)
    r = ev.compare(model, {**sizes, "kv_methods": methods})
    rel, ci = r.get("task_accuracy_relative"), r.get("task_accuracy_relative_ci")
    return {"rate": rate, "mode": mode, "methods": methods, "task_accuracy_relative": rel,
            "task_accuracy_relative_ci": ci, "ppl_increase_pct": r.get("ppl_increase_pct"),
            "ppl_increase_pct_ci": r.get("ppl_increase_pct_ci"), "tasks_kept": r.get("tasks_kept"),
            "tasks_total": r.get("tasks_total"), "kv_bytes_per_token": r.get("kv_bytes_per_token"),
            "kv_bytes_per_token_16bit": r.get("kv_bytes_per_token_16bit"),
            "combined_rate": 1 - r["kv_bytes_per_token_16bit"] / base16}


def items_for(p: float, half_width: float = 0.01) -> int:
    """Binomial items for a 95% interval of +-half_width at accuracy p (relative accuracy's
    interval is wider still: it divides by the original's, which has its own spread)."""
    p = min(max(p, 0.05), 0.95)
    return math.ceil((1.96 / half_width) ** 2 * p * (1 - p))


def search(ev, model: Path, mode: str, extra: dict, hi: float, steps: int, target: float, log,
           base16: float, sizes: dict | None = None) -> dict:
    """Bisect ``zack.rate`` for ``mode``; ``sizes``: engine resource overrides for every probe."""
    probes = []

    def ok(rate: float) -> bool:
        p = probe(ev, model, rate, mode, extra, base16, sizes or {})
        p["passes"] = p["task_accuracy_relative"] is not None and p["task_accuracy_relative"] >= target
        probes.append(p)
        log(f"{mode} rate {rate:.4f}: relative task accuracy {p['task_accuracy_relative']:.3f} "
            f"{p['task_accuracy_relative_ci']}, ppl {p['ppl_increase_pct']:+.2f}% -> {'pass' if p['passes'] else 'fail'}")
        return p["passes"]

    lo, top = 0.0, hi
    if not ok(0.0):                          # the other methods alone already miss the target
        return {"mode": mode, "rate": None, "probes": probes}
    if ok(hi):
        lo = hi
    else:
        for _ in range(steps):
            mid = round((lo + top) / 2, 4)
            if ok(mid):
                lo = mid
            else:
                top = mid
    found = next(p for p in probes if p["rate"] == lo)
    ci = found["task_accuracy_relative_ci"] or [None, None]
    failed_above = [p for p in probes if p["rate"] > lo]
    return {"mode": mode, "rate": lo, "next_failing_rate": min((p["rate"] for p in failed_above), default=None),
            "at_rate": found, "resolved": bool(ci[0] is not None and ci[0] >= target),
            "items_for_1pct": items_for(found["tasks_kept"] / max(found["tasks_total"], 1)) if found["tasks_total"]
            else None, "probes": probes}


def markdown(report: dict) -> str:
    lines = [f"Command: `{report['command']}`", "",
             "| mode | rate at >= 99% task accuracy | relative accuracy there [95%] | ppl increase there | "
             "combined compression | interval above 0.99? | probes |", "|---|---:|---:|---:|---:|---|---:|"]
    for s in report["searches"]:
        a = s.get("at_rate")
        if a is None:
            lines.append(f"| {s['mode']} | none (rate 0 misses) | | | | | {len(s['probes'])} |")
            continue
        ci = a["task_accuracy_relative_ci"]
        lines.append(f"| {s['mode']} | {s['rate']:.4f} | {a['task_accuracy_relative']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}] | "
                     f"{a['ppl_increase_pct']:+.2f}% | {a['combined_rate']:.3f} | {'yes' if s['resolved'] else 'no'} | "
                     f"{len(s['probes'])} |")
    lines += ["", "| mode | rate | relative task accuracy [95%] | ppl increase | KV bytes/token | passes |",
              "|---|---:|---:|---:|---:|---|"]
    for s in report["searches"]:
        for p in sorted(s["probes"], key=lambda p: p["rate"]):
            ci = p["task_accuracy_relative_ci"]
            lines.append(f"| {s['mode']} | {p['rate']:.4f} | {p['task_accuracy_relative']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}] | "
                         f"{p['ppl_increase_pct']:+.2f}% | {p['kv_bytes_per_token']:.0f} | {p['passes']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", required=True, help="corpus directory (held-out split)")
    ap.add_argument("--model", default="SmolLM2-135M-Instruct-ZACK", help="a ZACK model (dir or shipped name)")
    ap.add_argument("--baseline", default="default", help="the original model")
    ap.add_argument("--modes", nargs="+", default=["adaptive", "uniform"], choices=["adaptive", "uniform"])
    ap.add_argument("--with", dest="extra", default="{}", metavar="JSON", help="other KV methods in every probe")
    ap.add_argument("--hi", type=float, default=0.5, help="highest rate probed (default: %(default)s)")
    ap.add_argument("--steps", type=int, default=5, help="bisection steps after the ends (default: %(default)s)")
    ap.add_argument("--target", type=float, default=0.99, help="relative task accuracy to keep")
    ap.add_argument("--task-items", type=int, default=160, help="task items per kind (default: %(default)s)")
    ap.add_argument("--samples", type=int, default=48, help="scored sequences for perplexity")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE",
                    help="resource sizes for both engines (kv_cache_memory_gb, max_num_seqs, torch_threads)")
    ap.add_argument("--out", required=True, help="JSON path (a .md table is written next to it)")
    args = ap.parse_args(argv)

    from modelkit.evaluate import Evaluation, bytes_16bit
    from modelkit.evaluate_cli import parse_overrides
    from modelkit.models import resolve_model

    extra = json.loads(args.extra)
    sizes = parse_overrides(args.engine_arg)
    baseline, model = resolve_model(args.baseline), Path(resolve_model(args.model))
    t0 = time.time()
    ev = Evaluation(baseline, Path(args.corpus), args.samples, seed=args.seed, baseline_overrides=sizes,
                    metrics=("ppl", "tasks"), task_items=args.task_items)
    report = {"command": command_line(), "model": str(model),
              "target": args.target, "extra_methods": extra, "searches": []}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # The denominator of every compression figure: a 16-bit cache of the uncompressed model.
    base16 = bytes_16bit(model, {"kv_methods": {"zack": False}})[0]
    for mode in args.modes:
        report["searches"].append(search(ev, model, mode, extra, args.hi, args.steps, args.target,
                                         lambda s: print(s, file=sys.stderr, flush=True), base16, sizes))
        report["seconds"] = round(time.time() - t0)
        out.write_text(json.dumps(report, indent=1))
    out.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
