"""Quantized serving at the ~1B Llama shape: ours against llama.cpp on the same Q4_K_M file, and our
W8A8 against our bf16 on batched prefill.

    python -m benchmarks serve quant prepare          # files, once (~10 min): see below (--prefill-only: no llama.cpp)
    python -m benchmarks serve quant tpot             # single stream: ours Q4_K_M vs llama.cpp Q4_K_M
    python -m benchmarks serve quant prefill          # 1024/32 x N at once: ours W8A8 vs ours bf16 (and float32)
    python -m benchmarks serve quant smol             # single stream on SmolLM2: ours vs llama.cpp, bf16 and Q4_1

``prepare`` writes, under ``--work`` (default ``<cache>/models/llama-1b-quant``): random bf16 weights of
benchmarks/lib/model_shapes.py's LLAMA_1B (refengine's dummy weights, seed 0, N(0, 0.02^2)) as an HF
directory ``hf/``; a bf16 GGUF of it by llama.cpp's ``convert_hf_to_gguf.py --outtype bf16``; a
Q4_K_M GGUF by its ``llama-quantize`` (the peer's own mix: Q4_K, Q6_K for some V / down
projections and the tied embedding); ``q4km/`` (config, tokenizer, the Q4_K_M file linked: what
our worker serves with ``--load-format gguf``); ``w8a8/`` (``modelkit quantize`` of ``hf/``, no
smoothing: random weights have no outliers to move). llama.cpp comes from
studies/llamacpp_build.sh (``--llamacpp``); it is a peer here, never a dependency.

``tpot``: one server at a time (ours, then llama.cpp's ``llama-server -t <cores> -c 32768 --parallel 16
-cb``, DESIGN.md section 8's flags), the same client (``loadtest``: token-id prompts, ``ignore_eos``,
vLLM's metric definitions) sending ``--prompts`` (4) random prompts of 256 tokens, 64 out, one at a time
(``--max-concurrency 1``), after a warm-up request; ``--repeats`` rounds, servers alternating. Figure:
median TPOT (and TTFT) per server; ratio ours / llama.cpp -> ``q4_single_stream_tpot_ratio_vs_llamacpp_1b``.

``prefill``: ours with the W8A8 checkpoint against ours with ``hf/`` in bfloat16 (and in float32, this
CPU's default where bf16 is emulated), ``--prefill-prompts`` prompts of 1024 tokens, 32 out, all at
once; total tokens/s; ratio W8A8 / bf16 -> ``int8_prefill_ratio_vs_bf16`` (W8A8 / float32 beside it).

``smol`` (issue 46's single-stream figures): the embedded SmolLM2, ``--smol-prompts`` (8) prompts of 256
tokens, 128 out, one at a time, ``--repeats`` rounds; five servers: ours in bf16, ours as users run it
by default (``--dtype auto``: float32 on a CPU without native bf16 arithmetic, where one decode step
reads twice the bytes; recorded, not in a key) and ours served from the model's own Q4_1 GGUF
(``--load-format gguf``), llama.cpp on a bf16 GGUF of the same weights (its ``convert_hf_to_gguf.py
--outtype bf16`` of the prepared model, made once under ``--work``) and on the Q4_1 GGUF itself.
Ratios ours / llama.cpp -> ``single_stream_tpot_ms_ratio_vs_llamacpp`` (ours bf16 against its bf16 GGUF) and ``single_stream_tpot_ms_ratio_vs_llamacpp_q4`` (Q4_1 against Q4_1); written to
``results/perf/llamacpp_single_stream.json``.

Both write ``results/perf/quant_1b.json`` (merged per mode) and merge their keys into
``results/perf/summary.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.lib.records import ROOT, merge_json, write_json
from benchmarks.lib.procs import settle
from benchmarks.serve.suite import start, stop

SERVED = "m"
OUT = ROOT / "results" / "perf"


def default_work() -> Path:
    from swiftcommon import envs

    return envs.cache_dir() / "models" / "llama-1b-quant"


def run(cmd: list[str], env: dict | None = None) -> None:
    print("$", " ".join(map(str, cmd)), flush=True)
    subprocess.run([str(c) for c in cmd], check=True, env={**os.environ, **(env or {})})


def prepare(work: Path, llamacpp: Path, prefill_only: bool = False) -> None:
    import torch
    from safetensors.torch import save_file

    from benchmarks.lib.model_shapes import LLAMA_1B, llama_1b_dir
    from modelkit.models import resolve_model
    from refengine.dummy_weights import DummyWeights
    from refengine.model_config import parse_model_config

    work.mkdir(parents=True, exist_ok=True)
    shape_dir = llama_1b_dir(resolve_model("default"))
    hf = work / "hf"
    if not (hf / "model.safetensors").is_file():
        hf.mkdir(exist_ok=True)
        w = DummyWeights(parse_model_config(LLAMA_1B), seed=0)
        save_file({n: w.get(n, torch.bfloat16).contiguous() for n in w.names()}, str(hf / "model.safetensors"))
        for f in shape_dir.iterdir():
            shutil.copy2(f, hf / f.name)
    if not prefill_only:
        prepare_gguf(work, llamacpp, hf, shape_dir)
    if not (work / "w8a8" / "model.safetensors").is_file():
        run([sys.executable, "-m", "modelkit", "quantize", "--model", hf, "--output", work / "w8a8", "--quiet"])


def prepare_gguf(work: Path, llamacpp: Path, hf: Path, shape_dir: Path) -> None:
    """The bf16 and Q4_K_M GGUFs of ``hf`` by llama.cpp's own tools, and ``q4km/`` serving the latter."""
    bf16, q4 = work / "llama-1b-bf16.gguf", work / "llama-1b-Q4_K_M.gguf"
    if not bf16.is_file():
        run([sys.executable, llamacpp / "convert_hf_to_gguf.py", hf, "--outtype", "bf16", "--outfile", bf16],
            env={"PYTHONPATH": str(llamacpp / "gguf-py")})
    if not q4.is_file():
        run([llamacpp / "build" / "bin" / "llama-quantize", bf16, q4, "Q4_K_M"])
    q4dir = work / "q4km"
    q4dir.mkdir(exist_ok=True)
    for f in shape_dir.iterdir():
        shutil.copy2(f, q4dir / f.name)
    if not (q4dir / q4.name).exists():
        os.link(q4, q4dir / q4.name)


def ours(model: Path, dtype: str, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "worker", "--model", str(model), "--served-model-name", SERVED, "--dtype", dtype,
            "--max-model-len", "2048", *extra]


def llama_server(llamacpp: Path, gguf: Path) -> list[str]:
    cores = str(os.cpu_count() or 1)
    return [str(llamacpp / "build" / "bin" / "llama-server"), "-m", str(gguf), "-t", cores, "-c", "32768",
            "--parallel", "16", "-cb", "--alias", SERVED, "--host", "127.0.0.1"]


# A run's per-request and per-token lists (loadtest's records): what the summaries above are computed
# from, kept out of the committed JSON (each run's statistics stay).
PER_REQUEST = ("requests", "input_lens", "output_lens", "ttfts", "itls", "generated_texts")


def drive(port: int, n: int, n_in: int, n_out: int, concurrency: int | None, seed: int) -> dict:
    from loadtest.datasets import random_prompts
    from loadtest.runner import RunConfig, run as run_load

    cfg = RunConfig(base_url=f"http://127.0.0.1:{port}", model=SERVED, rate=float("inf"), num_requests=n, warmup=0,
                    seed=seed, label=f"{n_in}/{n_out}", max_concurrency=concurrency)
    res = asyncio.run(run_load(cfg, random_prompts(n, n_in, n_out, seed=seed), progress=False))
    for key in PER_REQUEST:
        res.pop(key, None)
    if res.get("completed", 0) < n:
        raise RuntimeError(f"port {port}: {res.get('completed')} of {n} completed")
    return res


def compare(servers: dict[str, list[str]], args, workload: tuple[int, int, int, int | None], metric: str) -> dict:
    """Start every server (one port each), then ``--repeats`` rounds, each server in turn (order rotated)."""
    n, n_in, n_out, conc = workload
    logs = OUT / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    procs, ports, runs = {}, {}, {name: [] for name in servers}
    try:
        for i, (name, argv) in enumerate(servers.items()):
            ports[name] = args.port + i
            print(f"== {name}: starting on port {ports[name]}", flush=True)
            procs[name] = start(argv, {}, ports[name], logs / f"quant_{name}.log", args.start_timeout)
        for name in servers:                      # warm-up on other prompts
            settle(procs.values())
            drive(ports[name], 1, n_in, n_out, 1, seed=1000)
        names = list(servers)
        for r in range(args.repeats):
            for name in names[r % len(names):] + names[:r % len(names)]:
                settle(procs.values())
                res = drive(ports[name], n, n_in, n_out, conc, seed=r)
                runs[name].append(res)
                print(f"   {name} #{r}: {metric}={res[metric]:.2f} median_ttft_ms={res['median_ttft_ms']:.0f} "
                      f"median_tpot_ms={res['median_tpot_ms']:.1f}", flush=True)
    finally:
        for p in procs.values():
            stop(p)
    return {name: {"median": statistics.median(x[metric] for x in rs), "metric": metric,
                   "median_ttft_ms": statistics.median(x["median_ttft_ms"] for x in rs), "runs": rs}
            for name, rs in runs.items()}


def smol_servers(work: Path, llamacpp: Path) -> dict[str, list[str]]:
    """The five single-stream servers of ``smol`` (the bf16 GGUF made first if missing)."""
    from modelkit.models import resolve_model

    model = resolve_model("default")
    q41 = next(model.glob("*.Q4_1.gguf"))
    bf16 = work / "smollm2-135m-bf16.gguf"
    if not bf16.is_file():
        work.mkdir(parents=True, exist_ok=True)
        run([sys.executable, llamacpp / "convert_hf_to_gguf.py", model, "--outtype", "bf16", "--outfile", bf16],
            env={"PYTHONPATH": str(llamacpp / "gguf-py")})
    return {"ours_bf16": ours(model, "bfloat16", []), "ours_auto": ours(model, "auto", []),
            "ours_q4_1": ours(model, "auto", ["--load-format", "gguf"]),
            "llamacpp_bf16": llama_server(llamacpp, bf16), "llamacpp_q4_1": llama_server(llamacpp, q41)}


def merge_outputs(mode: str, record: dict, keys: dict) -> None:
    path = OUT / ("llamacpp_single_stream.json" if mode == "smol" else "quant_1b.json")
    doc = json.loads(path.read_text()) if path.is_file() else {}
    doc[mode] = record
    write_json(path, doc)
    merge_json(OUT / "summary.json", keys)
    print(json.dumps(keys, indent=1))


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("mode", choices=["prepare", "tpot", "prefill", "smol"])
    ap.add_argument("--work", type=Path, default=None, help="files folder (default: <cache>/models/llama-1b-quant)")
    ap.add_argument("--llamacpp", type=Path, default=Path("/work/peers/llama.cpp"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=4, help="tpot: prompts per run (one at a time)")
    ap.add_argument("--smol-prompts", type=int, default=8, help="smol: prompts per run (one at a time)")
    ap.add_argument("--prefill-prompts", type=int, default=16, help="prefill: prompts of 1024 tokens per run")
    ap.add_argument("--no-float32", action="store_true", help="prefill: skip the float32 server")
    ap.add_argument("--prefill-only", action="store_true",
                    help="prepare: only what prefill needs (hf/ and w8a8/; no llama.cpp)")
    ap.add_argument("--port", type=int, default=18531)
    ap.add_argument("--start-timeout", type=float, default=900)


def main(args: argparse.Namespace) -> int:
    work = args.work or default_work()
    if args.mode == "prepare":
        prepare(work, args.llamacpp, args.prefill_only)
        return 0
    from benchmarks.report.perf import machine_info

    record = {"command": args.command, "machine_start": machine_info(ROOT, ".venv-vllm"),
              "loadavg_start": os.getloadavg(), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if args.mode == "smol":
        res = compare(smol_servers(work, args.llamacpp), args, (args.smol_prompts, 256, 128, 1), "median_tpot_ms")
        keys = {"single_stream_tpot_ms_ratio_vs_llamacpp":
                round(res["ours_bf16"]["median"] / res["llamacpp_bf16"]["median"], 4),
                "single_stream_tpot_ms_ratio_vs_llamacpp_q4":
                round(res["ours_q4_1"]["median"] / res["llamacpp_q4_1"]["median"], 4)}
    elif args.mode == "tpot":
        servers = {"ours_q4_k_m": ours(work / "q4km", "auto", ["--load-format", "gguf"]),
                   "llamacpp_q4_k_m": llama_server(args.llamacpp, work / "llama-1b-Q4_K_M.gguf")}
        res = compare(servers, args, (args.prompts, 256, 64, 1), "median_tpot_ms")
        ratio = res["ours_q4_k_m"]["median"] / res["llamacpp_q4_k_m"]["median"]
        keys = {"q4_single_stream_tpot_ratio_vs_llamacpp_1b": round(ratio, 4)}
    else:
        servers = {"ours_w8a8": ours(work / "w8a8", "bfloat16", []), "ours_bf16": ours(work / "hf", "bfloat16", [])}
        if not args.no_float32:
            servers["ours_float32"] = ours(work / "hf", "float32", [])
        res = compare(servers, args, (args.prefill_prompts, 1024, 32, None), "total_token_throughput")
        ratio = res["ours_w8a8"]["median"] / res["ours_bf16"]["median"]
        keys = {"int8_prefill_ratio_vs_bf16": round(ratio, 4)}
        if "ours_float32" in res:
            keys["int8_prefill_ratio_vs_float32"] = round(res["ours_w8a8"]["median"] / res["ours_float32"]["median"], 4)
    record.update(results=res, ratios=keys, loadavg_end=os.getloadavg())
    merge_outputs(args.mode, record, keys)
    return 0
