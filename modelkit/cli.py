"""``modelkit``: the model-transformation toolkit's command line.

Each subcommand lives in its own module, which exposes ``register(subparsers)``;
the module is imported only when listed here, and heavy imports happen inside
each command's ``run``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMAND_MODULES = [
    "modelkit.prepare_cli",   # prepare
    "modelkit.swiftkv_cli",   # convert-swiftkv
    "modelkit.corpus_cli",    # build-corpus
    "modelkit.distill",       # distill
    "modelkit.distill_plot",  # plot-distill
    "modelkit.evaluate_cli",  # eval
    "modelkit.zack_cli",      # zack-calibrate
    "modelkit.quantize_cli",  # quantize, gguf-dir
]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="modelkit", description="SwiftServe model toolkit: prepare, convert, distil, evaluate.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue
            raise
        mod.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
