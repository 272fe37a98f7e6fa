"""The stages of ``gpu-check``, in the order a call runs them, and the plan it prints first.

One ``Stage`` per entry of ``STAGES``: its function (``(Context, timeout_s) -> record``), what it
does, its device-time estimate on an H200 (measured where ``measured`` says so, else a guess
from the work it does), the least time it needs to start in a call (less: ``deferred`` to the
next call), its time cap per call, the stages and pack files it waits for, and its
fingerprint (a ``done`` record with the same fingerprint is not run again; ``None``: the stage
runs on every call). Priority is the order: the reference engine's checks, then vLLM's
correctness, SwiftKV against stock vLLM at 8B, and the distillation last, which waits while any
other stage still waits for parts or time, then takes whatever time is left and resumes from its
checkpoint.

Adding a stage (issue 46 adds the reference engine's CUDA-graph decode and bandwidth
measurements): write its function (a module beside ``stages.py``), give it an entry before
``distill`` with an estimate, and a fingerprint if it should not rerun; ``session`` and the plan
pick it up, and ``collect`` records it like any other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from gpubundle import distill_stage, stages, vllm_stages
from gpubundle.pack import read_manifest
from gpubundle.stages import Context


def _vllm_fp(ctx: Context) -> str | None:
    return ctx.state.get("vllm", {}).get("fingerprint") or ""


def _pack_vllm_fp(ctx: Context) -> str | None:
    return ((read_manifest(ctx.cfg.pack) or {}).get("meta", {}).get("vllm") or {}).get("digest", "")


def _model_fp(ctx: Context) -> str:
    return "model" if ctx.state.get("model", {}).get("model_dir") else "no-model"


def _distill_fp(ctx: Context) -> str:
    src = distill_stage.distill_source(ctx)
    return f"{src['kind']}:{src['model_dir']}:{ctx.cfg.distill_steps}" if "kind" in src else ""


def _model_files(meta: dict) -> list[str]:
    return [f for f in [meta.get("model_file")] if f]


def _vllm_files(meta: dict) -> list[str]:
    v = meta.get("vllm") or {}
    return [a["name"] for a in v.get("archives", [])] + [o["wheel"] for o in v.get("overrides", [])]


@dataclass(frozen=True)
class Stage:
    name: str
    run: Callable[[Context, float], dict]
    what: str
    estimate_s: float
    measured: bool = False                       # estimate_s read off an H200 run (results/gpu/README.md)
    min_s: float = 0.0
    timeout_s: float | None = None               # None: the time left in the call
    after: tuple[str, ...] = ()                  # stages whose results it needs
    files: Callable[[dict], list[str]] = field(default=lambda meta: [])    # pack files it needs
    fingerprint: Callable[[Context], str | None] = field(default=lambda ctx: None)


STAGES: list[Stage] = [
    Stage("env", stages.stage_env, "Python, torch, the GPU; the pack's wheels where a module is missing", 10, True),
    Stage("model", stages.stage_model, "joins the parts; SmolLM2's GGUF -> model directory; windows, shipped tensors",
          40, True, min_s=30, timeout_s=240, files=_model_files),
    Stage("tests", stages.stage_tests, "pytest tests/gpu -m 'not vllm': the reference engine on CUDA", 40, True,
          min_s=60, timeout_s=300, after=("model",), fingerprint=_model_fp),
    Stage("bench", stages.stage_bench, "python -m benchmarks engine gpu: the reference engine at an 8B shape", 15, True,
          min_s=60, timeout_s=300, fingerprint=lambda ctx: " ".join(ctx.cfg.bench_args)),
    Stage("vllm", vllm_stages.stage_vllm, "unpacks the carried vLLM, checks the image's packages, imports it with "
          "the plugin", 34, True, min_s=30, timeout_s=240, files=_vllm_files, fingerprint=_pack_vllm_fp),
    # the first GPU run (2026-11-29, H200) stopped it at 338 s with none of its six groups finished: each
    # group starts two vLLM engines (compiled, eager) and the reference engine, six at once on 16 cores
    Stage("vllm-tests", vllm_stages.stage_vllm_tests, "pytest tests/gpu -m vllm: SwiftKV g=1/g=2, FP8 KV, ZACK "
          "uniform / layer-wise and its head sizes, CUDA graphs vs eager vs the reference engine", 450, min_s=400,
          after=("vllm", "model"), fingerprint=_vllm_fp),
    Stage("vllm-8b", vllm_stages.stage_vllm_8b, "python -m benchmarks serve vllm_gpu_8b: 50% SwiftKV vs stock vLLM at a "
          "Llama-3.1-8B shape", 323, True, min_s=180, timeout_s=480, after=("vllm",),
          fingerprint=lambda ctx: f"{_vllm_fp(ctx)} {' '.join(ctx.cfg.vllm_8b_args)}"),
    # issue 46: the reference engine's CUDA-graph decode and bandwidth-limit stage goes here
    Stage("distill", distill_stage.stage_distill, "modelkit distill -l 15 on CUDA, resuming from its checkpoint",
          180, True, after=("model",), fingerprint=_distill_fp),
]
BY_NAME = {s.name: s for s in STAGES}
ORDER = [s.name for s in STAGES]


def _missing_parts(pack: Path, manifest: dict, names: list[str]) -> list[str]:
    """Parts still absent for the pack files ``names`` (chunk presence only; ``assemble`` verifies)."""
    files = manifest.get("files", {})
    return sorted({c["part"] for n in names for c in files.get(n, {}).get("chunks", [])
                   if not (pack / c["part"] / c["file"]).is_file()})


def plan_lines(ctx: Context, budget_s: float) -> list[str]:
    """What this call is expected to do, stage by stage, with estimates (printed before it starts)."""
    cfg = ctx.cfg
    manifest = read_manifest(cfg.pack) or {}
    meta = manifest.get("meta", {})
    here = sorted(p.name for p in Path(cfg.pack).glob("part*") if p.is_dir())
    lines = [f"pack: {', '.join(here) or 'no part'} here of {manifest.get('parts', 0)}; budget {budget_s:.0f} s "
             f"(less {cfg.collect_reserve_s:.0f} s for the output folder)"]
    left = 0.0
    for st in STAGES:
        if st.name != "env" and st.name not in cfg.stages:
            continue
        prev = ctx.state.get(st.name, {})
        fp = st.fingerprint(ctx)
        est = f"~{st.estimate_s:.0f} s{'' if st.measured else ' (estimate)'}"
        done = prev.get("status") == "done" and prev.get("fingerprint") == fp
        if fp is not None and st.name not in cfg.redo and done:
            note = "done in an earlier call"
        else:
            parts = _missing_parts(Path(cfg.pack), manifest, st.files(meta)) if manifest else []
            waits = [a for a in st.after if ctx.state.get(a, {}).get("status") != "done"]
            note = est + (f", waits for {', '.join(parts)}" if parts else "") + \
                (f", after {', '.join(waits)}" if waits else "")
            left += st.estimate_s
        lines.append(f"  {st.name:<11} {note} - {st.what}")
    lines.append(f"estimated device time of what is left: ~{left / 60:.1f} min "
                 f"(the distillation takes whatever time a call has left)")
    return lines
