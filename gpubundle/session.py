"""``gpu-check``: the stages of a GPU session in order, within a time budget, resumable.

``run_check(cfg)`` prints the plan (``registry.plan_lines``: every stage with its estimate, what
is done, what waits for which pack parts), then runs the stages of ``registry.STAGES`` in order
against a deadline of ``budget_s - collect_reserve_s`` from its start, then writes the output
folder (``gpubundle.collect``). ``<work>/state.json`` keeps every stage's last record
between calls: a ``done`` stage whose fingerprint still matches is skipped (``--redo NAME``
runs it again; ``--redo distill`` also starts the distillation afresh), a stage that would
start with less than its minimum time left is ``deferred`` to the next call, and the
distillation waits while another stage still waits (for parts or time: ``UNFINISHED``), then
takes whatever time is left. Exit status: 0, or 1 when a stage failed or
timed out, or 2 when the output folder would not come back whole.

Paths in ``SessionConfig`` are relative to ``root`` (the repository) unless absolute.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpubundle import stages
from gpubundle.collect import collect
from gpubundle.limits import Limits
from gpubundle.registry import BY_NAME, ORDER, plan_lines


UNFINISHED = ("waiting", "deferred", "timeout", "partial")    # a stage that will run again on the next call


@dataclass
class SessionConfig:
    root: Path = Path(".")
    work: Path = Path(".gpu-work")
    out: Path = Path("gpu-out")
    pack: Path = Path(".gpu-pack")
    python: str = sys.executable
    device: str = "cuda"
    budget_s: float = 540.0
    collect_reserve_s: float = 30.0
    stages: list[str] = field(default_factory=lambda: list(ORDER))
    redo: list[str] = field(default_factory=list)
    tests: list[str] = field(default_factory=lambda: ["tests/gpu", "-m", "not vllm"])
    bench_args: list[str] = field(default_factory=list)
    vllm_8b_args: list[str] = field(default_factory=list)
    distill_model: str = "auto"
    distill_l: int = 15
    distill_groups: list[int] = field(default_factory=lambda: [1])
    distill_steps: int = 2000
    distill_seq_len: int = 512          # random-weights runs; carried windows fix their own
    distill_chat_repeats: int = 2
    distill_micro_batch: int = 16
    distill_grad_accum: int = 1
    distill_eval_every: int = 200
    distill_eval_windows: int = 16
    distill_save_every: int = 50
    distill_init: str = "auto"          # auto: the carried shipped tensors of (l, groups) if any, else lstsq
    distill_init_windows: int = 256
    distill_dtype: str = "bfloat16"
    distill_compile: bool = True
    distill_overhead_s: float = 90.0    # loading, initialising and compiling before the timed loop
    distill_max_s: float | None = None  # cap on one call's training time (None: the time left)
    limits: Limits = field(default_factory=Limits)

    def resolved(self) -> "SessionConfig":
        root = Path(self.root).resolve()
        paths = {k: (p if Path(p).is_absolute() else root / p) for k, p in
                 (("work", self.work), ("out", self.out), ("pack", self.pack))}
        return SessionConfig(**{**vars(self), "root": root, **paths})


def _stage(name: str, ctx: stages.Context, deadline: float) -> dict | None:
    """Run one stage (or say why not); None when an earlier call already did it."""
    st, cfg = BY_NAME[name], ctx.cfg
    prev, env = ctx.state.get(name, {}), ctx.state.get("env", {})
    if name != "env" and env.get("status") != "done":
        return {"status": "skipped", "reason": "environment incomplete: " + ", ".join(env.get("missing", []))}
    fp = st.fingerprint(ctx)
    if fp is not None and name not in cfg.redo and prev.get("status") == "done" and prev.get("fingerprint") == fp:
        return None
    if name == "distill":                  # last: the time the other stages leave, once they have had theirs
        pending = [n for n in ORDER if n not in ("env", "distill") and n in cfg.stages
                   and ctx.state.get(n, {}).get("status") in UNFINISHED]
        if pending:
            return {**prev, "status": "waiting", "reason": f"after {', '.join(pending)}"}
    left = deadline - time.monotonic()
    if left < st.min_s or (name == "distill" and left <= cfg.distill_overhead_s):
        return {**prev, "status": "deferred", "reason": f"{left:.0f} s left in this call's budget"}
    print(f"[gpu-check] {name}: running ({left:.0f} s left)", flush=True)
    start = time.monotonic()
    rec = st.run(ctx, min(left, st.timeout_s or left))
    return {**rec, "seconds": round(time.monotonic() - start, 1)}


def run_check(cfg: SessionConfig) -> int:
    cfg = cfg.resolved()
    t0 = time.monotonic()
    deadline = t0 + cfg.budget_s - cfg.collect_reserve_s
    cfg.work.mkdir(parents=True, exist_ok=True)
    state_path = cfg.work / "state.json"
    saved = json.loads(state_path.read_text()) if state_path.is_file() else {"calls": 0, "stages": {}}
    saved["calls"] += 1
    if "distill" in cfg.redo:
        shutil.rmtree(cfg.work / "distill", ignore_errors=True)
    ctx = stages.Context(cfg, saved["stages"], env=dict(os.environ))
    print("\n".join(f"[gpu-check] {line}" for line in [f"call {saved['calls']}: plan"] +
                     plan_lines(ctx, cfg.budget_s)), flush=True)
    for name in ORDER:
        if name != "env" and name not in cfg.stages:
            continue
        rec = _stage(name, ctx, deadline)
        if rec is None:
            print(f"[gpu-check] {name}: done in an earlier call", flush=True)
            continue
        ctx.state[name] = rec
        state_path.write_text(json.dumps(saved, indent=1, default=str))
        print(f"[gpu-check] {name}: {rec['status']}" + (f" ({rec['reason']})" if rec.get("reason") else ""), flush=True)
    res = collect(cfg, ctx.state, ctx.state.get("env", {}), saved["calls"], time.monotonic() - t0, cfg.limits)
    print((cfg.out / "summary.md").read_text(), flush=True)
    if res["problems"]:
        return 2
    return 1 if any(r.get("status") in ("failed", "timeout") for r in ctx.state.values()) else 0
