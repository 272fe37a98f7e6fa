"""Where a decode step's wall time goes (issue 46), at batch 1 and 32, layer by layer of the server.

    python -m benchmarks serve step_breakdown --out results/perf/step_breakdown.json

The worker's own engine settings (``worker.args`` defaults, ``--dtype``), prompts of ``--input-len``
random token ids, ``ignore_eos``; only steps where every request decodes are counted.

1. **Engine, in process** (``LLMEngine.step``), each stage timed with ``perf_counter`` wrappers:
   scheduling (``schedule`` + ``update``), input preparation (the runner's tensors and attention
   metadata: ``execute`` minus what follows), model compute (the layers without attention),
   attention (every layer's ``attend``), LM head, sampling, and the engine's bookkeeping after
   ``update`` (outputs, releases). Medians per step over ``--steps`` steps. Where the C++ layer loop
   runs the layers (``refengine.decode_stack``; ``"decode_stack": true`` in the record) attention is
   inside that one call and counts as model compute; ``SWIFTSERVE_DECODE_STACK=0`` splits it out.
2. **Host time**: a second pass with ``torch.profiler`` over the decode steps; *kernel* time is the self
   CPU time (per step) of the math (oneDNN / aten GEMMs and the C++ kernels, ``swiftserve::*``), and a step's host time is its
   wall time (pass 1) minus its kernel time: Python, dispatch of every small op, metadata, sampling
   and scheduling. ``decode_step_host_ms`` is that at batch 1.
3. **Engine process hand-off**: the worker's engine core in its own process (``ProcessEngine``,
   pickled over pipes) serving the same batch through ``generate``: the median interval between a
   stream's tokens, and the hand-off as the mean interval minus the engine process's own mean step over
   the same tokens (its step counters, ``engine_steps_total`` / ``engine_step_seconds_total``, arrive
   with each token). Not the interval minus pass 1's step: on this shared VM a step's time drifts by
   10-20% between minutes, more than the hand-off itself (the first version's 8.2 ms "hand-off" was that).
4. **Detokenisation**: the worker's ``IncrementalDetokenizer`` on the tokens the batch produced,
   per step (one token per stream).
5. **HTTP streaming**: a worker (``python -m worker``) serving the batch as streamed completions
   (token-id prompts, each chunk timed on arrival); its median TPOT minus layers 3 and 4 (the
   serving layer: request handling, SSE encoding, the event loop, the client's read).

Prints a table per batch size and writes every figure to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import random
import statistics
import sys
import time
from pathlib import Path

from benchmarks.lib.records import write_json

KERNEL_PREFIXES = ("swiftserve::", "mkldnn::", "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm",
                   "aten::_scaled_dot_product")
STAGES = ("scheduling", "input_prep", "model_compute", "attention", "lm_head", "sampling", "engine_bookkeeping")


def engine_config(args):
    """The worker's EngineConfig for ``--model``/``--dtype`` with every other worker default."""
    from worker.args import build_parser, config_from_args

    wargs = build_parser().parse_args(["--model", args.model, "--dtype", args.dtype, "--max-model-len", "2048",
                                       "--load-format", args.load_format])
    return config_from_args(wargs).engine_config


def prompts(n: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1000, 40000) for _ in range(length)] for _ in range(n)]


class Timers:
    """Accumulated wall time per key, from wrappers put on instances (and one module function)."""

    def __init__(self) -> None:
        self.t: collections.Counter = collections.Counter()

    def wrap(self, obj, name: str, key: str) -> None:
        f = getattr(obj, name)

        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                self.t[key] += time.perf_counter() - t0

        setattr(obj, name, timed)


def instrument(eng) -> Timers:
    import refengine.model_runner as mr

    tm = Timers()
    tm.wrap(eng.scheduler, "schedule", "schedule")
    tm.wrap(eng.scheduler, "update", "update")
    tm.wrap(eng.runner, "execute", "execute")
    tm.wrap(eng.runner.model, "forward", "forward")
    tm.wrap(eng.runner.model, "logits", "lm_head")
    for layer in {id(x): x for x in eng.runner.kv.layers}.values():
        tm.wrap(layer, "attend", "attention")
    tm.wrap(mr, "sample", "sampling")
    return tm


def decode_steps(eng, batch: int, args, on_step, around=contextlib.nullcontext) -> None:
    """Add ``batch`` requests, step until each has its first token, then call ``on_step(step_fn)`` for
    ``args.steps`` decode steps (the engine's ``step``, which the caller times) inside ``around()``."""
    from refengine.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=args.steps + args.warmup + 4, temperature=0, ignore_eos=True)
    tag = f"b{batch}-{time.monotonic_ns()}"
    for i, p in enumerate(prompts(batch, args.input_len, seed=batch)):
        eng.add_request(f"{tag}-{i}", p, params)
    started: set[str] = set()
    while len(started) < batch:
        started.update(o.request_id for o in eng.step())
    for _ in range(args.warmup):
        eng.step()
    with around():
        for _ in range(args.steps):
            on_step(eng.step)
    while eng.has_unfinished():
        eng.step()


def in_process(eng, batch: int, args) -> dict:
    """Stage medians per step (ms) and the step's median wall time."""
    tm = instrument(eng)
    walls, per_step = [], []

    def one(step):
        tm.t.clear()
        t0 = time.perf_counter()
        step()
        wall = time.perf_counter() - t0
        t = dict(tm.t)
        walls.append(wall)
        ex, fw, head, att = t.get("execute", 0), t.get("forward", 0), t.get("lm_head", 0), t.get("attention", 0)
        samp = t.get("sampling", 0)
        sched = t.get("schedule", 0) + t.get("update", 0)
        per_step.append({"scheduling": sched, "input_prep": ex - fw - head - samp, "model_compute": fw - att,
                         "attention": att, "lm_head": head, "sampling": samp,
                         "engine_bookkeeping": wall - ex - sched})

    decode_steps(eng, batch, args, one)
    med = {k: round(1e3 * statistics.median(s[k] for s in per_step), 3) for k in STAGES}
    return {"step_ms": round(1e3 * statistics.median(walls), 3), "stages_ms": med}


def kernel_ms(eng, batch: int, args) -> tuple[float, list]:
    """Kernel self time per decode step (ms; the profiler runs over the decode steps only), and the top ops."""
    from torch.profiler import ProfilerActivity, profile

    box = {}

    def around():
        box["p"] = profile(activities=[ProfilerActivity.CPU])
        return box["p"]

    decode_steps(eng, batch, args, lambda step: step(), around)
    events = box["p"].key_averages()
    kern = sum(e.self_cpu_time_total for e in events if e.key.startswith(KERNEL_PREFIXES))
    top = sorted(((e.key, e.self_cpu_time_total / 1e3 / args.steps, e.count) for e in events), key=lambda x: -x[1])[:25]
    return kern / 1e3 / args.steps, [[k, round(ms, 3), c] for k, ms, c in top]


async def _handoff(config, batch: int, args) -> dict:
    """The engine process serving ``batch`` streams: the median interval between a stream's tokens, and over
    one window of the first stream (from its ``warmup + 2``-th token to its last) the mean interval and the
    engine process's own mean step (its ``engine_step_seconds_total`` / ``engine_steps_total`` counters, which
    arrive with each token): their difference is the hand-off, both measured in the same seconds."""
    from refengine.engine_process import engine_client
    from refengine.sampling_params import SamplingParams

    eng = engine_client(config, "process")
    await eng.start()
    params = SamplingParams(max_tokens=args.steps + args.warmup + 4, temperature=0, ignore_eos=True)
    gaps: list[float] = []
    window: list[tuple[float, int, float, float]] = []       # (arrival, tokens, engine steps, engine step s)
    try:
        async def stream(i: int, p: list[int], record: bool) -> None:
            last, n = None, 0
            async for out in eng.generate(f"h{batch}-{i}-{record}", p, params):
                now = time.perf_counter()
                n += len(out.new_token_ids)
                if record and n > args.warmup + 2:
                    if last is not None:
                        gaps.append((now - last) / max(1, len(out.new_token_ids)))
                    if i == 0:
                        x = eng.stats().extra
                        window.append((now, n, x["engine_steps_total"], x["engine_step_seconds_total"]))
                last = now

        ps = prompts(batch, args.input_len, seed=batch)
        await asyncio.gather(*(stream(i, p, False) for i, p in enumerate(ps[:1])))      # warm-up
        await asyncio.gather(*(stream(i, p, True) for i, p in enumerate(ps)))
    finally:
        await eng.shutdown()
    (t0, n0, s0, e0), (t1, n1, s1, e1) = window[0], window[-1]
    interval, step = 1e3 * (t1 - t0) / (n1 - n0), 1e3 * (e1 - e0) / (s1 - s0)
    return {"process_interval_ms": round(1e3 * statistics.median(gaps), 3),
            "process_interval_mean_ms": round(interval, 3), "process_step_ms": round(step, 3),
            "process_steps_per_token": round((s1 - s0) / (n1 - n0), 3), "handoff_ms": round(interval - step, 3)}


def detok_ms(model: str, batch: int, args) -> float:
    """The worker's incremental detokeniser: ms per step for ``batch`` streams (one token each)."""
    from transformers import AutoTokenizer

    from worker.detokenizer import IncrementalDetokenizer

    tok = AutoTokenizer.from_pretrained(model)
    rng = random.Random(batch)
    outs = [[rng.randrange(1000, 40000) for _ in range(args.steps)] for _ in range(batch)]
    dets = [IncrementalDetokenizer(tok, p) for p in prompts(batch, args.input_len, seed=batch)]
    t0 = time.perf_counter()
    for j in range(args.steps):
        for d, ids in zip(dets, outs):
            d.add(ids[j])
    return 1e3 * (time.perf_counter() - t0) / args.steps


def served_tpot_ms(args, batch: int, port: int) -> float:
    import httpx

    from benchmarks.serve.suite import start, stop

    argv = [sys.executable, "-m", "worker", "--model", args.model, "--dtype", args.dtype, "--max-model-len", "2048",
            "--load-format", args.load_format, "--served-model-name", "m"]
    proc = start(argv, {}, port, Path(args.log_dir) / f"worker-b{batch}.log", 900)
    gaps: list[float] = []
    try:
        async def stream(client, p: list[int], record: bool) -> None:
            body = {"model": "m", "prompt": p, "max_tokens": args.steps + args.warmup + 4, "temperature": 0,
                    "ignore_eos": True, "stream": True}
            last, n = None, 0
            async with client.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    now = time.perf_counter()
                    n += 1
                    if last is not None and record and n > args.warmup + 2:
                        gaps.append(now - last)
                    last = now

        async def go():
            async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=batch + 4)) as client:
                ps = prompts(batch, args.input_len, seed=batch)
                await stream(client, ps[0], False)
                await asyncio.gather(*(stream(client, p, True) for p in ps))

        asyncio.run(go())
    finally:
        stop(proc)
    return 1e3 * statistics.median(gaps)


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="SmolLM2-135M-Instruct")
    ap.add_argument("--dtype", default="auto", help="the worker's --dtype (default: %(default)s)")
    ap.add_argument("--load-format", default="auto",
                    help="the worker's --load-format, e.g. gguf for the model's own GGUF file (default: %(default)s)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=64, help="decode steps measured per batch size")
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--layers", default="engine,host,handoff,detok,http",
                    help="comma-separated subset of engine,host,handoff,detok,http")
    ap.add_argument("--log-dir", default="/tmp")


def main(args: argparse.Namespace) -> int:
    layers = set(args.layers.split(","))
    from modelkit.models import resolve_model
    from benchmarks.lib.procs import free_port

    from refengine.engine import LLMEngine

    args.model = str(resolve_model(args.model))
    config = engine_config(args)
    results = {}
    eng = LLMEngine(config) if layers & {"engine", "host"} else None
    for b in args.batches:
        r = {"batch": b}
        if "engine" in layers:
            r.update(in_process(eng, b, args))
        if "host" in layers:
            ker, top = kernel_ms(eng, b, args)
            r["kernel_ms"] = round(ker, 3)
            r["top_ops_ms_per_step"] = top
            if "step_ms" in r:
                r["host_ms"] = round(r["step_ms"] - ker, 3)
        results[b] = r
    stacked = eng is not None and eng.runner.model._stack is not None       # the C++ layer loop ran the layers
    if eng is not None:
        del eng
    for b in args.batches:
        r = results[b]
        if "handoff" in layers:
            r.update(asyncio.run(_handoff(config, b, args)))
        if "detok" in layers:
            r["detok_ms"] = round(detok_ms(args.model, b, args), 3)
        if "http" in layers:
            r["http_tpot_ms"] = round(served_tpot_ms(args, b, free_port()), 3)
            if "process_interval_ms" in r and "detok_ms" in r:
                r["http_streaming_ms"] = round(r["http_tpot_ms"] - r["process_interval_ms"] - r["detok_ms"], 3)
    if stacked:
        print("\n(the C++ layer loop ran the layers: attention is inside model_compute; SWIFTSERVE_DECODE_STACK=0 "
              "splits it out)")
    for b, r in results.items():
        print(f"\nbatch {b}: step {r.get('step_ms')} ms (host {r.get('host_ms')}, kernels {r.get('kernel_ms')})")
        for k, v in r.get("stages_ms", {}).items():
            print(f"  {k:20s} {v:8.3f} ms")
        for k in ("process_step_ms", "process_interval_mean_ms", "handoff_ms", "detok_ms", "http_streaming_ms",
                  "process_interval_ms", "http_tpot_ms"):
            if k in r:
                print(f"  {k:20s} {r[k]:8.3f} ms")
    doc = {"command": args.command, "dtype": str(config.dtype), "input_len": args.input_len, "decode_stack": stacked,
           "steps": args.steps, "results": {str(b): r for b, r in results.items()}}
    write_json(args.out, doc)
    return 0
