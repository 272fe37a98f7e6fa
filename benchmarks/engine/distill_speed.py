"""Distillation tokens/s without and with the trunk/teacher cache, side by side.

Two trainers with the same settings on the same training windows: ``plain``
(every step runs layers 0..l-1, the teacher's layers l..L-1 and its LM head, then the
students) and ``cached`` (``--cache``: those come from modelkit.distill_cache; only the
students run). After an untimed warm-up step of the plain trainer, the
timed steps alternate plain / cached on the same micro-batch so that machine drift
hits both; the cache's first-visit cost (compute + store) is the cached trainer's first
step. Also reports how much of the teacher's temperature-T mass the cached top-k hold.

    python -m benchmarks engine distill_speed --corpus ~/.cache/swiftserve/corpus/smollm2-v2 -l 22 \\
        --out results/swiftkv/distill_speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch


def _step(tr, rows: torch.Tensor) -> tuple[float, float]:
    """One optimiser step -> (wall seconds, CPU seconds of this process, all threads)."""
    t0, c0 = time.perf_counter(), time.process_time()
    ids = tr.train[rows]
    losses = tr._forward_cached(rows, ids) if tr.cache else tr._fwd(ids.to(tr.device))
    losses.sum().backward()
    tr.opt.step()
    tr.opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t0, time.process_time() - c0


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default="default")
    ap.add_argument("--corpus", required=True)
    ap.add_argument("-l", type=int, default=22)
    ap.add_argument("--groups", type=int, nargs="+", default=[1])
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--topk", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per trainer")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)


def main(args: argparse.Namespace) -> int:
    from modelkit.distill_config import DistillConfig
    from modelkit.distill_train import Trainer
    from modelkit.models import resolve_model

    base = resolve_model(args.model)
    tmp = Path(tempfile.mkdtemp(prefix="distill-speed-"))
    n = args.micro_batch
    common = dict(model=str(base), corpus=args.corpus, l=args.l, groups=args.groups, seq_len=args.seq_len,
                  micro_batch=args.micro_batch, grad_accum=1, steps=args.steps, dtype="float32", compile=False,
                  eval_windows=1, train_windows=n, topk=args.topk, threads=args.threads)
    plain = Trainer(DistillConfig(output=str(tmp / "plain"), **common), base)
    cached = Trainer(DistillConfig(output=str(tmp / "cached"), cache=str(tmp / "cache"), **common), base)
    batch = torch.arange(args.micro_batch)
    _step(plain, batch)                                         # warm-up (allocator, first-call costs)
    miss = [_step(cached, batch)]                               # first visit: compute + store
    t_plain, t_cached = [], []
    for _ in range(args.steps):
        t_plain.append(_step(plain, batch))
        t_cached.append(_step(cached, batch))
    tokens = args.micro_batch * args.seq_len
    t = cached._targets(batch, cached.train[batch])
    mass = float((t["val"] / cached.cfg.temperature - t["lse"].unsqueeze(-1)).exp().sum(-1).mean())
    wall = lambda ts: tokens / statistics.median(t[0] for t in ts)   # noqa: E731
    cpu = lambda ts: tokens / statistics.median(t[1] for t in ts)    # noqa: E731
    res = {"command": args.command,
           "hardware": f"{platform.machine()}, {os.cpu_count()} cpus, {torch.get_num_threads()} threads",
           "torch": torch.__version__, "l": args.l, "groups": args.groups, "tokens_per_step": tokens,
           "plain_tok_s": wall(t_plain), "cached_tok_s": wall(t_cached), "cached_first_visit_tok_s": wall(miss),
           "plain_tok_per_cpu_s": cpu(t_plain), "cached_tok_per_cpu_s": cpu(t_cached),
           "cached_first_visit_tok_per_cpu_s": cpu(miss),
           "plain_step_s": t_plain, "cached_step_s": t_cached, "first_visit_step_s": miss,
           "topk": args.topk, "teacher_mass_in_topk_T2": mass,
           "cache_bytes_per_window": sum(f.stat().st_size for f in (tmp / "cache").glob("w*.pt")) // n}
    res["speedup"] = res["cached_tok_s"] / res["plain_tok_s"]
    res["speedup_cpu"] = res["cached_tok_per_cpu_s"] / res["plain_tok_per_cpu_s"]
    md = (f"Command: `{res['command']}`\n\n{res['hardware']}, torch {res['torch']}, l={args.l}, g={args.groups}, "
          f"{tokens} tokens per step, medians of {args.steps} alternating steps. Tokens per CPU-second "
          "(process time, all threads) is the figure that holds on a shared machine.\n\n"
          "| trainer | tokens/s (wall) | tokens per CPU-second |\n|---|---:|---:|\n"
          f"| plain (trunk + teacher + students every step) | {res['plain_tok_s']:.1f} | "
          f"{res['plain_tok_per_cpu_s']:.1f} |\n"
          f"| cached, window seen before (students only) | {res['cached_tok_s']:.1f} | "
          f"{res['cached_tok_per_cpu_s']:.1f} |\n"
          f"| cached, first visit (compute + store) | {res['cached_first_visit_tok_s']:.1f} | "
          f"{res['cached_first_visit_tok_per_cpu_s']:.1f} |\n\n"
          f"Speed-up on cached windows: {res['speedup']:.2f}x wall, {res['speedup_cpu']:.2f}x CPU. Teacher mass (T=2) in the top-{args.topk}: "
          f"{mass:.3f}. "
          f"Cache: {res['cache_bytes_per_window'] / 1e6:.2f} MB per window.\n")
    print(md)
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2))
        Path(args.out).with_suffix(".md").write_text("# Distillation speed, plain vs cached\n\n" + md)
    return 0
