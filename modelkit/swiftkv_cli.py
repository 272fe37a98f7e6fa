"""``modelkit convert-swiftkv``: a plain HF model (directory or known name) -> a SwiftKV checkpoint.

The command line only: it resolves ``--model`` (``modelkit.models``), picks ``l`` from
``-l`` or ``--swiftkv-fraction`` and calls ``swiftkv.write_swiftkv_checkpoint``, which holds
the format and takes directories.
"""

from __future__ import annotations

import argparse
import json

from modelkit.models import resolve_model
from modelkit.swiftkv import write_swiftkv_checkpoint


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "convert-swiftkv",
        help="convert a plain HF Llama/Mistral/Qwen2/Qwen3/Gemma 3 checkpoint into a SwiftKV checkpoint "
             "(before distillation)",
        description="Write a SwiftKV checkpoint (Snowflake/ArcticTraining format) initialised as the papers "
                    "describe. Distil it afterwards with `modelkit distill` to recover quality.")
    p.add_argument("--model", default="default", help="base model dir or 'default' (default: %(default)s)")
    p.add_argument("--output", required=True, help="output directory")
    grp = p.add_mutually_exclusive_group()
    grp.add_argument("--num-key-value-layers", "-l", type=int, default=None,
                     help="layers that keep their own KV (l); later layers take KV from layer l-1's output")
    grp.add_argument("--swiftkv-fraction", type=float, default=0.5,
                     help="fraction of layers whose prefill is skipped, used when -l is not given "
                          "(default: %(default)s -> l = L - round(fraction * L))")
    p.add_argument("--key-value-group-size", "-g", type=int, default=1,
                   help="AcrossKV: consecutive later layers sharing one KV cache (default: %(default)s)")
    p.add_argument("--tensors", default=None,
                   help="safetensors file of trained SwiftKV tensors to use instead of the initialisation")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from safetensors.torch import load_file

    base = resolve_model(args.model)
    L = int(json.loads((base / "config.json").read_text())["num_hidden_layers"])
    l = args.num_key_value_layers if args.num_key_value_layers is not None else L - round(args.swiftkv_fraction * L)
    tensors = load_file(args.tensors) if args.tensors else None
    out = write_swiftkv_checkpoint(base, args.output, l, args.key_value_group_size, tensors)
    print(f"wrote SwiftKV checkpoint (l={l} of {L}, g={args.key_value_group_size}) to {out}")
    return 0
