"""``modelkit eval``: the command (its flags, ``--kv-methods`` sweeps, ``--engine-arg`` overrides for every
evaluated model, ``--model-arg LABEL:KEY=VALUE`` for one).

What it measures and how is ``modelkit.evaluate`` (``Evaluation``); this module turns the
command line into the runs, validates every KV combination before any model loads, and writes
``--out`` (JSON + a markdown table) after each model.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from modelkit import evaluate
from modelkit.evaluate import METRICS, Evaluation, markdown_table


def sweep(methods: dict | list) -> list[tuple[str, dict]]:
    """``{"zack": {"rate": [0.3, 0.5], "mode": "uniform"}}`` -> one (suffix, methods) per combination.

    A list of such objects is swept item by item; its suffixes name the methods (``{}``: none)."""
    import itertools

    if isinstance(methods, list):
        out = []
        for item in methods:
            name = "+".join(item) or "none"
            out += [(f"[{name}]" if not suffix else f"[{name}]{suffix}", combo) for suffix, combo in sweep(item)]
        return out
    axes = [(m, k, v) for m, opts in methods.items() if isinstance(opts, dict)
            for k, v in opts.items() if isinstance(v, list)]
    if not axes:
        return [("", methods)]
    out = []
    for values in itertools.product(*(v for _, _, v in axes)):
        combo = json.loads(json.dumps(methods))
        for (m, k, _), val in zip(axes, values):
            combo[m][k] = val
        out.append(("[" + ",".join(f"{m}.{k}={val}" for (m, k, _), val in zip(axes, values)) + "]", combo))
    return out


def parse_overrides(pairs: list[str]) -> dict:
    out = {}
    for p in pairs:
        if "=" not in p:
            raise SystemExit(f"--engine-arg expects KEY=VALUE, got {p!r}")
        k, v = p.split("=", 1)
        try:
            out[k.replace("-", "_")] = json.loads(v)
        except json.JSONDecodeError:
            out[k.replace("-", "_")] = v
    return out


def model_args(pairs: list[str], labels: list[str]) -> dict[str, dict]:
    """``--model-arg LABEL:KEY=VALUE`` items -> {label: overrides}; a label no ``--model`` has is refused."""
    out: dict[str, list[str]] = {}
    for p in pairs:
        label, sep, kv = p.partition(":")
        if not sep or "=" not in kv:
            raise SystemExit(f"--model-arg expects LABEL:KEY=VALUE, got {p!r}")
        if label not in labels:
            raise SystemExit(f"--model-arg {p!r}: no --model is labelled {label!r} (labels: {', '.join(labels)})")
        out.setdefault(label, []).append(kv)
    return {label: parse_overrides(kvs) for label, kvs in out.items()}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="compare transformed models with the original (ppl through cache, KL, "
                                    "greedy agreement, tasks)", description=evaluate.__doc__.split("\n\n")[0])
    p.add_argument("--model", action="append", required=True, metavar="[LABEL=]MODEL",
                   help="model to evaluate (dir or known name), repeatable; optional LABEL= prefix")
    p.add_argument("--baseline", default="default", help="the original model (default: %(default)s)")
    p.add_argument("--corpus", required=True, help="corpus directory (held-out split is used)")
    p.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="EngineConfig override for the evaluated models, e.g. kv_cache_dtype=fp8_e4m3 (resource "
                        "sizes kv_cache_memory_gb, max_num_seqs, torch_threads apply to the baseline too)")
    p.add_argument("--model-arg", action="append", default=[], metavar="LABEL:KEY=VALUE",
                   help="EngineConfig override for one evaluated model (its LABEL, or its MODEL without one) on top "
                        "of --engine-arg, e.g. bf16:dtype=bfloat16: models that need different settings share one "
                        "run, so the baseline is measured once")
    p.add_argument("--kv-methods", default=None, metavar="JSON",
                   help='KV methods for the evaluated models (see swiftserve-worker --help); an option given '
                        'as a list is swept, e.g. \'{"zack": {"rate": [0.3, 0.5], "mode": ["adaptive", "uniform"]}}\'')
    p.add_argument("--metrics", default="ppl,greedy,tasks",
                   help="comma-separated subset of " + ",".join(METRICS) + " (default: %(default)s; needle also "
                        "needs --needle N)")
    p.add_argument("--needle", type=int, default=0, metavar="N",
                   help="needle-in-a-haystack items (adds 'needle' to --metrics)")
    p.add_argument("--needle-context", type=int, default=2048, help="haystack tokens per needle item")
    p.add_argument("--no-tasks", dest="tasks", action="store_false",
                   help="skip the task suite (same as leaving 'tasks' out of --metrics)")
    p.add_argument("--task-items", type=int, default=25,
                   help="generated task items per kind; every model runs all of them (the strict figure reads "
                        "those the original solves) (default: "
                        "%(default)s: the earlier suite plus 25 reading items; raise it for tighter intervals)")
    p.add_argument("--join-docs", action="store_true",
                   help="score sequences made of held-out passages joined RAG-style (allows long --prefix)")
    p.add_argument("--samples", type=int, default=64, help="scored held-out sequences (default: %(default)s)")
    p.add_argument("--prefix", type=int, default=256, help="prefix tokens (prefilled)")
    p.add_argument("--continuation", type=int, default=64, help="continuation tokens (decoded through the cache)")
    p.add_argument("--gen-prompts", type=int, default=32, help="held-out chat prompts for greedy agreement")
    p.add_argument("--gen-tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="JSON output path (a .md table is written next to it)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from modelkit.models import resolve_model

    baseline = resolve_model(args.baseline)
    overrides = parse_overrides(args.engine_arg)
    combos = [("", overrides.get("kv_methods", {}))]
    if args.kv_methods is not None:
        try:
            methods = json.loads(args.kv_methods)
        except json.JSONDecodeError as exc:
            raise SystemExit(f"modelkit eval: --kv-methods is not valid JSON: {exc}")
        if not isinstance(methods, dict) and not (isinstance(methods, list) and methods
                                                   and all(isinstance(m, dict) for m in methods)):
            raise SystemExit("modelkit eval: --kv-methods must be a JSON object or a list of objects")
        combos = sweep(methods)
    metrics = tuple(m for m in args.metrics.split(",") if m and (args.tasks or m != "tasks")) \
        + (("needle",) if args.needle else ())
    bad = [m for m in metrics if m not in METRICS]
    if bad:
        raise SystemExit(f"modelkit eval: unknown --metrics {', '.join(bad)} (known: {', '.join(METRICS)})")
    if {"ppl", "greedy", "needle"} & set(metrics):       # the metrics that read the corpus's held-out split
        from modelkit.corpus import missing

        if why := missing(Path(args.corpus)):
            raise SystemExit(f"modelkit eval: {why}")
    from tqdm import tqdm

    from refengine.kv import registry

    per_model = model_args(args.model_arg, [spec.rpartition("=")[0] or spec for spec in args.model])
    runs = []
    for spec in args.model:                          # validate every combination before loading anything
        label, _, name = spec.rpartition("=")
        model = resolve_model(name)
        own = dict(overrides, **per_model.get(label or name, {}))
        for suffix, methods in combos:
            reason = registry.check(methods, model, own.get("swiftkv", True),
                                    own.get("kv_cache_dtype", "auto"), own.get("block_size"))
            if reason:
                raise SystemExit(f"modelkit eval: {label or name}{suffix}: --kv-methods: {reason}")
            runs.append(((label or name) + suffix, model, dict(own, kv_methods=methods)))
    results, t0 = {}, time.time()
    # Resource sizes (not the model or its KV methods) apply to the baseline's engine too.
    sizes = {k: v for k, v in overrides.items() if k in ("kv_cache_memory_gb", "max_num_seqs", "torch_threads")}
    ev = Evaluation(baseline, Path(args.corpus), args.samples, args.prefix, args.continuation, args.gen_prompts,
                    args.gen_tokens, args.seed, baseline_overrides=sizes, join_docs=args.join_docs, metrics=metrics,
                    n_needle=args.needle, needle_context=args.needle_context,
                    task_items=args.task_items)
    cmd = "modelkit " + " ".join(shlex.quote(a) for a in sys.argv[1:])

    def write(done: bool) -> str:
        """``--out`` after every model, so a long sweep that stops early keeps what it measured."""
        table = markdown_table(results)
        if args.out:
            out = Path(args.out)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps({"command": cmd, "seconds": round(time.time() - t0), "complete": done,
                                       "results": results}, indent=2))
            out.with_suffix(".md").write_text(f"Command: `{cmd}`\n\n{table}\n")
        return table

    for label, model, kw in tqdm(runs, desc="models", unit="model"):
        results[label] = ev.compare(model, kw)
        write(False)
    print(write(True))
    return 0
