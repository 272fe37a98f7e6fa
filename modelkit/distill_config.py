"""``DistillConfig``: the settings of one ``modelkit distill`` run, and its learning-rate schedule.

Shared by the command line (``distill``, which builds it from the flags and uses its defaults
as theirs) and the trainer (``distill_train``), so neither imports the other. Plain data, no
torch. ``lr_at``: linear warm-up over ``warmup * steps`` steps, then cosine (or linear) decay
to ``min_lr_ratio * lr``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class DistillConfig:
    model: str
    output: str
    corpus: str
    l: int
    groups: list[int] = field(default_factory=lambda: [1])
    seq_len: int = 512
    micro_batch: int = 2
    grad_accum: int = 4
    steps: int = 800
    lr: float = 3e-4
    min_lr_ratio: float = 0.0
    warmup: float = 0.05
    weight_decay: float = 0.05
    schedule: str = "cosine"
    temperature: float = 2.0
    hidden_mse: float = 0.0
    clip: float = 1.0
    dtype: str = "bfloat16"          # autocast dtype; "float32" disables autocast
    device: str = "auto"
    compile: bool = True
    grad_checkpointing: bool = False
    chat_repeats: int = 2
    eval_every: int = 100
    eval_windows: int = 16
    save_every: int = 25
    max_hours: float | None = None
    init: str = "original"           # "original" | "lstsq" | directory of an earlier run's tensors
    init_windows: int = 256
    cache: str | None = None         # directory of per-window trunk/teacher outputs (modelkit.distill_cache)
    topk: int = 64                   # teacher logits kept per position in the cache
    cache_dtype: str = "float16"     # storage dtype of cached hidden states
    train_windows: int = 0           # train on this many windows (seeded pick; 0 = all), i.e. epochs over them
    seed: int = 0
    threads: int | None = None


def lr_at(cfg: DistillConfig, step: int) -> float:
    warm = max(1, int(cfg.warmup * cfg.steps))
    if step < warm:
        return cfg.lr * (step + 1) / warm
    frac = (step - warm) / max(1, cfg.steps - warm)
    if cfg.schedule == "linear":
        decay = 1 - frac
    else:
        decay = 0.5 * (1 + math.cos(math.pi * frac))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * decay)
