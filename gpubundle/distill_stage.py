"""The ``distill`` stage of ``gpu-check``: a time-boxed, resumable ``modelkit distill`` run.

Which model (``--distill-model``):
- ``pack`` (what ``auto`` picks when the pack declares a model): the carried model and the
  carried windows; ``waiting`` until every part of the model has arrived;
- ``random`` (what ``auto`` picks when the pack has no model): SmolLM2-135M's shape with
  random weights and random token windows. Its loss means nothing and its tensors do not
  come back; it measures what the GPU does per step (tokens/s, memory), which sizes a real run;
- a directory: that plain model with the carried windows.

Where it starts (``--distill-init``, ``modelkit distill --init``): ``auto`` picks the first
carried folder holding ``swiftkv-l{l}-g{g}.safetensors`` for every trained group size, placed
by the ``model`` stage: ``<work>/resume`` (an earlier session's tensors, ``gpu-pack --resume``),
then the shipped tensors (``<work>/checkpoints/...``) when they are the pack model's: the 50%
run continues from the shipped l15-g1 instead of starting over; otherwise ``lstsq``.
``original``, ``lstsq`` or a folder are passed on as given. A run that has a ``state.pt``
resumes from it whatever the start.

The run directory ``<work>/distill`` keeps ``state.pt`` between calls (``modelkit distill``
resumes from it); each call trains until ``--max-hours`` (the call's time left less
``distill_overhead_s`` for loading and compiling) or until ``distill_steps`` are done.
"""

from __future__ import annotations

import json
from pathlib import Path

from gpubundle import payloads
from gpubundle.random_model import SMOLLM2, write_random_llama
from gpubundle.stages import Context


def _random_source(ctx: Context) -> dict:
    import torch

    cfg = ctx.cfg
    model = ctx.work / "random-smollm2"
    if not (model / "model.safetensors").is_file():
        write_random_llama(model, SMOLLM2, seed=0)
    corpus = ctx.work / "corpus-random"
    corpus.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    for split, n, repeats in (("train", 256, cfg.distill_chat_repeats), ("heldout", cfg.distill_eval_windows, 1)):
        path = corpus / payloads.windows_name(split, cfg.distill_seq_len, repeats, 0)
        if not path.is_file():
            torch.save(torch.randint(3, SMOLLM2["vocab_size"], (n, cfg.distill_seq_len), generator=g), path)
    return {"kind": "random", "model_dir": str(model), "corpus": str(corpus), "seq_len": cfg.distill_seq_len,
            "chat_repeats": cfg.distill_chat_repeats, "seed": 0}


def distill_source(ctx: Context) -> dict:
    """Where the stage's model and windows come from, or a record saying why it cannot run yet."""
    cfg, model = ctx.cfg, ctx.state.get("model", {})
    choice = cfg.distill_model
    if choice == "auto":
        choice = "pack" if model.get("pack", {}).get("model_file") else "random"
    if choice == "random":
        return _random_source(ctx)
    if choice == "pack" and not model.get("model_dir"):
        return {"status": "waiting" if model.get("status") == "waiting" else "skipped",
                "reason": model.get("reason") or "the pack carries no model (make gpu-pack)"}
    w = model.get("pack", {}).get("windows")
    if not w or not model.get("corpus"):
        return {"status": "skipped", "reason": "no distillation windows carried (make gpu-pack)"}
    kind, model_dir = ("pack", model["model_dir"]) if choice == "pack" else ("dir", choice)
    return {"kind": kind, "model_dir": model_dir, "corpus": model["corpus"], "seq_len": w["seq_len"],
            "chat_repeats": w["chat_repeats"], "seed": w["seed"]}


def carried_init(ctx: Context, src: dict) -> Path | None:
    """The carried folder holding this run's starting tensors (pack model only): the tensors of an
    earlier session (``<work>/resume``) before the shipped ones; None when neither has them all."""
    model = ctx.state.get("model", {})
    meta = model.get("pack", {})
    if src["kind"] != "pack":
        return None
    folders = [ctx.work / "resume"] if model.get("resume") else []
    if meta.get("shipped", {}).get("base") == meta.get("model_name"):
        folders += sorted({(ctx.work / "checkpoints" / rel).parent for rel in model.get("shipped", [])})
    l = ctx.cfg.distill_l
    for folder in folders:
        # the names modelkit.distill_train.tensor_file gives (that module imports torch; this process does not)
        if all((folder / f"swiftkv-l{l}-g{g}.safetensors").is_file() for g in ctx.cfg.distill_groups):
            return folder
    return None


def init_choice(ctx: Context, src: dict) -> str:
    if ctx.cfg.distill_init != "auto":
        return ctx.cfg.distill_init
    folder = carried_init(ctx, src)
    return str(folder) if folder else "lstsq"


def last_step(run_dir: Path) -> int:
    log = run_dir / "train_log.jsonl"
    if not log.is_file():
        return 0
    lines = log.read_text().strip().splitlines()
    return json.loads(lines[-1])["step"] if lines else 0


def stage_distill(ctx: Context, timeout: float) -> dict:
    cfg = ctx.cfg
    src = distill_source(ctx)
    if "status" in src:
        return src
    run_dir = ctx.work / "distill"
    seconds = timeout - cfg.distill_overhead_s
    if cfg.distill_max_s is not None:
        seconds = min(seconds, cfg.distill_max_s)
    init = init_choice(ctx, src)
    rec = {"kind": src["kind"], "model_dir": src["model_dir"], "target_steps": cfg.distill_steps, "init": init,
           "fingerprint": f"{src['kind']}:{src['model_dir']}:{cfg.distill_steps}", "run_dir": str(run_dir)}
    if seconds <= 0:
        return {**rec, "status": "partial", "steps": last_step(run_dir), "reason": "no time left in this call"}
    cmd = [cfg.python, "-m", "modelkit", "distill", "--model", src["model_dir"], "--output", str(run_dir),
           "--corpus", src["corpus"], "-l", str(cfg.distill_l), "--groups", *map(str, cfg.distill_groups),
           "--seq-len", str(src["seq_len"]), "--chat-repeats", str(src["chat_repeats"]), "--seed", str(src["seed"]),
           "--micro-batch", str(cfg.distill_micro_batch), "--grad-accum", str(cfg.distill_grad_accum),
           "--steps", str(cfg.distill_steps), "--eval-every", str(cfg.distill_eval_every),
           "--eval-windows", str(cfg.distill_eval_windows), "--save-every", str(cfg.distill_save_every),
           "--init", init, "--init-windows", str(cfg.distill_init_windows), "--dtype", cfg.distill_dtype,
           "--device", cfg.device, "--max-hours", repr(seconds / 3600)]
    if not cfg.distill_compile:
        cmd.append("--no-compile")
    before = last_step(run_dir)
    rc = ctx.run("distill", cmd, timeout)
    rec.update(steps_before=before, steps=last_step(run_dir))
    if rc is None:
        return {**rec, "status": "partial", "reason": "stopped at the call's time limit; resumes from the last save"}
    if rc != 0:
        return {**rec, "status": "failed", "rc": rc}
    done = (run_dir / "run.json").is_file() and rec["steps"] >= cfg.distill_steps
    return {**rec, "status": "done" if done else "partial"}
