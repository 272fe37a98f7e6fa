"""``modelkit build-corpus``: the distillation corpus (sources and licences in modelkit.corpus)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("build-corpus", help="build the offline distillation corpus (package texts + teacher answers)",
                       description="Collect texts that ship in this machine's Debian and Python packages, split "
                                   "train/held-out by document hash, and answer instruction prompts with the teacher "
                                   "model through the reference engine. Resumable.")
    p.add_argument("--output", required=True, help="corpus directory")
    p.add_argument("--model", default="default", help="teacher model dir or 'default' (default: %(default)s)")
    p.add_argument("--chat-train", type=int, default=800, help="teacher-answered training prompts")
    p.add_argument("--chat-heldout", type=int, default=100, help="teacher-answered held-out prompts")
    p.add_argument("--heldout-fraction", type=float, default=0.05)
    p.add_argument("--max-answer-tokens", type=int, default=160, help="length limit of teacher answers")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="teacher dtype (auto: float32 on CPU, bfloat16 on CUDA)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from modelkit.corpus import build
    from modelkit.models import resolve_model

    manifest = build(Path(args.output), resolve_model(args.model), args.chat_train, args.chat_heldout,
                     args.seed, args.heldout_fraction, args.max_answer_tokens, args.dtype)
    print(json.dumps(manifest["counts"], indent=2))
    return 0
