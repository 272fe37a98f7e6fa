"""``modelkit distill``: SwiftKV knowledge-preserving distillation.

Trains ``q/k/v_proj_swiftkv`` and ``norm_swiftkv`` of layers >= l (initialised from
the originals) so that the SwiftKV model's next-token distributions match the
original model's: loss = KL(teacher || student) at temperature T (default 2.0) times
T^2, optionally + MSE of the hidden state before the last layer (``--hidden-mse W``, the
recipe's layer -2 term). AdamW, linear
warm-up then cosine (or linear) decay, gradient accumulation and clipping, optional
gradient checkpointing, bf16 autocast (CPU with AVX-512 bf16, or CUDA), optional
torch.compile. Resumable: ``state.pt`` in the output directory is rewritten
atomically every ``--save-every`` steps and at a ``--max-hours`` stop.

Initialisation (``--init``): ``original`` is the papers' (each layer's own k/v_proj,
the group mean for AcrossKV); ``lstsq`` replaces the K/V projections with the linear
maps that best reproduce the original keys and values from layer l's input (ridge
regression over ``--init-windows`` windows, modelkit.distill_init), which on
SmolLM2-135M starts as close to the teacher as an hour of CPU distillation from
``original``; a directory warm-starts from the ``swiftkv-l{l}-g{g}.safetensors`` of an
earlier run.

``--cache DIR`` (modelkit.distill_cache) stores, per training window, the hidden state
entering layer l and the teacher's top-k logits with their log-sum-exp; a window seen
again (``--train-windows N`` gives epochs over N windows; a rerun or another run with
the same corpus and l) then costs only the student's forward and backward.

Several AcrossKV group sizes can be trained in one run (``--groups 1 2``): they share
the frozen trunk and the teacher forward, which is most of the cost.

Outputs in ``--output``: ``swiftkv-l{l}-g{g}.safetensors`` (trained tensors, bf16),
``train_log.jsonl`` (one line per step), ``run.json`` (command, data, steps, time,
hardware, final held-out figures).
"""

from __future__ import annotations

import argparse
import json

from modelkit.distill_config import DistillConfig


def register(sub: argparse._SubParsersAction) -> None:
    d = DistillConfig(model="", output="", corpus="", l=0)
    p = sub.add_parser("distill", help="distil SwiftKV projections from the original model (KL on logits)",
                       description=__doc__.split("\n\n")[0] + " Trains only q/k/v_proj_swiftkv and norm_swiftkv.")
    p.add_argument("--model", default="default", help="plain base model dir or 'default' (default: %(default)s)")
    p.add_argument("--output", required=True, help="run directory (state, logs, trained tensors)")
    p.add_argument("--corpus", required=True, help="corpus directory from `modelkit build-corpus`")
    p.add_argument("--num-key-value-layers", "-l", type=int, required=True)
    p.add_argument("--groups", "-g", type=int, nargs="+", default=d.groups, help="AcrossKV group sizes to train")
    p.add_argument("--init", default=d.init, metavar="{original,lstsq,DIR}",
                   help="start of the SwiftKV tensors: the papers' copy of the originals, least-squares K/V, "
                        "or an earlier run's directory (default: %(default)s)")
    for name in ("seq_len", "micro_batch", "grad_accum", "steps", "eval_every", "eval_windows", "save_every",
                 "chat_repeats", "seed", "init_windows", "topk", "train_windows"):
        p.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(d, name))
    for name in ("lr", "min_lr_ratio", "warmup", "weight_decay", "temperature", "hidden_mse", "clip"):
        p.add_argument("--" + name.replace("_", "-"), type=float, default=getattr(d, name))
    p.add_argument("--schedule", choices=["cosine", "linear"], default=d.schedule)
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default=d.dtype,
                   help="autocast dtype (float32 = no autocast)")
    p.add_argument("--device", default=d.device)
    p.add_argument("--no-compile", dest="compile", action="store_false", help="skip torch.compile")
    p.add_argument("--grad-checkpointing", action="store_true")
    p.add_argument("--max-hours", type=float, default=None, help="save and stop after this long; rerun to resume")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--cache", default=None, metavar="DIR",
                   help="cache the frozen trunk's hidden state and the teacher's top-k logits per window here; "
                        "later visits run only the student (loss: KL over top-k + rest)")
    p.add_argument("--cache-dtype", choices=["float16", "bfloat16", "float32"], default=d.cache_dtype)
    p.add_argument("--fresh", action="store_true", help="ignore an existing state.pt in --output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from modelkit.distill_train import Trainer      # torch: only when the command runs
    from modelkit.models import resolve_model

    base = resolve_model(args.model)
    fields = DistillConfig.__dataclass_fields__
    cfg = DistillConfig(**{k: getattr(args, k) for k in fields if k not in ("model", "l") and hasattr(args, k)},
                        model=str(base), l=args.num_key_value_layers)
    trainer = Trainer(cfg, base)
    if not args.fresh and trainer.load_state():
        print(f"resuming at step {trainer.step}/{cfg.steps}")
    else:
        trainer.initialise()
    result = trainer.run()
    print(json.dumps({k: v for k, v in result.items() if k != "config"}, indent=2))
    return 0
