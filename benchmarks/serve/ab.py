"""Served A/B: one workload on server variants (server + environment), with CPU seconds per process.

    python -m benchmarks serve ab --workload decode_128_128 --repeats 3 \\
        --variant ours=ours --variant ours_thread=ours:SWIFTSERVE_ENGINE_CORE=thread \\
        --variant vllm_cpu=vllm_cpu --out results/perf/profiles/served_ab_engine_core.json

A variant is ``NAME=SERVER[:KEY=VALUE[,KEY=VALUE]]`` where SERVER is one of perf_suite's
servers and the pairs are extra environment variables of the server process (inherited by
its engine processes; ``KEY=`` removes KEY). All variants are started (one port each) and warmed up, then run
round by round, in turn, the order rotated each round (so a drift of the shared machine
hits them alike), ``--repeats`` rounds; around each run the CPU time (user + system)
of every process of the server's tree and of this client process is read, so a row says
where the cores went during the run (a share over 100% = more than one core).
Reports per variant the median and the median over rounds of its ratio to the first
variant in the same round. Writes JSON (every run) and a Markdown table next to it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import psutil

from benchmarks.lib.ab import interleaved, paired_ratio
from benchmarks.lib.profiling import cpu_seconds
from benchmarks.lib.records import UsageError, write_json
from benchmarks.lib.workloads import SERVING as WORKLOADS
from benchmarks.serve.suite import (SHAPES, run_workload, server_commands,
                                   start, stop, workloads_of_shape)


def parse_variant(text: str) -> tuple[str, str, dict[str, str]]:
    name, sep, rest = text.partition("=")
    if not sep or not name or not rest:
        raise argparse.ArgumentTypeError(f"expected NAME=SERVER[:KEY=VALUE,...], got {text!r}")
    server, _, env_text = rest.partition(":")
    env = {}
    for pair in filter(None, env_text.split(",")):
        k, sep, v = pair.partition("=")
        if not sep or not k:
            raise argparse.ArgumentTypeError(f"bad environment pair {pair!r} in {text!r}")
        env[k] = v
    return name, server, env


def measure(name: str, proc, port: int, args, seed: int) -> dict:
    """One measured run of the workload on a started server, with CPU seconds per process."""
    metric = WORKLOADS[args.workload][4]
    me, root = psutil.Process(), psutil.Process(proc.pid)
    before, mine, t0 = cpu_seconds(root), me.cpu_times(), time.monotonic()
    res = run_workload(port, args.workload, 1.0, seed=seed, shape=args.shape)
    after, mine2, wall = cpu_seconds(root), me.cpu_times(), time.monotonic() - t0
    cpu = {k: round(v - before.get(k, 0.0), 2) for k, v in after.items() if v - before.get(k, 0.0) >= 0.01}
    cpu["client"] = round(mine2.user + mine2.system - mine.user - mine.system, 2)
    print(f"   {name} seed {seed}: {metric}={res[metric]:.1f} wall={wall:.1f}s cpu_s={cpu}", flush=True)
    return {metric: res[metric], "seed": seed, "median_ttft_ms": res["median_ttft_ms"],
            "median_tpot_ms": res.get("median_tpot_ms"), "wall_s": round(wall, 2), "cpu_s": cpu}


def run_interleaved(variants: list[tuple[str, list, dict]], args, log_dir: Path) -> dict:
    """Start every variant (one port each), then run them in turn, round by round, the order
    rotated each round: a drift of the shared machine hits every variant alike. Idle
    servers wait on their queues, so they take no CPU from the one being measured."""
    procs = []
    try:
        for i, (name, argv, env) in enumerate(variants):
            print(f"== {name}: starting ({' '.join(f'{k}={v}' for k, v in env.items()) or 'no extra env'})",
                  flush=True)
            procs.append(start(argv, env, args.port + i, log_dir / f"{name}.log", args.start_timeout))
            run_workload(args.port + i, args.workload, 0.25, seed=1000, shape=args.shape)  # warm-up, other prompts
        names = [name for name, _, _ in variants]

        def one(name: str, r: int) -> dict:
            i = names.index(name)
            return measure(name, procs[i], args.port + i, args, seed=r)

        runs = interleaved(names, args.repeats, one)
    finally:
        for p in procs:
            stop(p)
    metric = WORKLOADS[args.workload][4]
    return {name: {"server": argv[:3], "env": env, "metric": metric,
                   "median": statistics.median(x[metric] for x in runs[name]), "runs": runs[name]}
            for name, argv, env in variants}


def markdown(doc: dict) -> str:
    lines = [f"# Served A/B: {doc['workload']}", "", f"Command: `{doc['command']}`", "",
             "| variant | extra env | median | runs | paired ratio to the first | CPU per run (s): server processes / client |",
             "|---|---|---:|---|---:|---|"]
    for name, v in doc["variants"].items():
        env = ", ".join(f"{k}={x}" for k, x in v["env"].items()) or "-"
        runs = ", ".join(f"{r[v['metric']]:.1f}" for r in v["runs"])
        cpu = "; ".join(" + ".join(f"{x:.1f}" for k, x in r["cpu_s"].items() if k != "client")
                        + f" / {r['cpu_s']['client']:.1f}" for r in v["runs"])
        ratio = doc.get("paired_ratio_to_first", {}).get(name)
        lines.append(f"| {name} | {env} | {v['median']:.1f} {v['metric']} | {runs} | "
                     f"{'' if ratio is None else f'{ratio:.3f}'} | {cpu} |")
    return "\n".join(lines) + "\n"


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--variant", type=parse_variant, action="append", required=True,
                    help="NAME=SERVER[:KEY=VALUE,...] (repeatable); SERVER: ours, ours_nocache, ours_swiftkv, vllm_cpu")
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="decode_128_128")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", default="default")
    ap.add_argument("--shape", choices=SHAPES, default="smollm2",
                    help="perf_suite's --shape (1b: random weights of a ~1B Llama, servers ours and vllm_cpu)")
    ap.add_argument("--swiftkv-model", default="SmolLM2-135M-Instruct-SwiftKV")
    ap.add_argument("--worker-args", default="", help="extra arguments for our worker")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                    help="model dtype of every server (ours and vllm-cpu alike)")
    ap.add_argument("--vllm-venv", default=".venv-vllm")
    ap.add_argument("--port", type=int, default=18432)
    ap.add_argument("--start-timeout", type=float, default=900)
    ap.add_argument("--out", default="results/perf/profiles/served_ab.json")


def main(args: argparse.Namespace) -> int:
    if args.workload not in workloads_of_shape(args.shape):
        raise UsageError(f"--shape {args.shape} has the workloads {', '.join(workloads_of_shape(args.shape))}")
    cmds = server_commands(args)
    for name, server, _ in args.variant:
        if server not in cmds:
            raise UsageError(f"variant {name}: unknown server {server!r} (one of {', '.join(cmds)})")
    out = Path(args.out)
    (out.parent / "logs").mkdir(parents=True, exist_ok=True)
    doc = {"command": args.command, "workload": args.workload, "repeats": args.repeats,
           "cpu_count": os.cpu_count(), "variants": {}}
    variants = [(name, cmds[server][0], {**cmds[server][1], **env}) for name, server, env in args.variant]
    doc["variants"] = run_interleaved(variants, args, out.parent / "logs")
    first = args.variant[0][0]
    metric = WORKLOADS[args.workload][4]
    # per variant: the median over rounds of (this variant / the first variant) in the same round
    doc["paired_ratio_to_first"] = {
        name: paired_ratio([x[metric] for x in v["runs"]], [x[metric] for x in doc["variants"][first]["runs"]])
        for name, v in doc["variants"].items()}
    write_json(out, doc)
    out.with_suffix(".md").write_text(markdown(doc))
    print(markdown(doc))
    return 0
