"""``modelkit quantize`` (an int8 W8A8 checkpoint, ``modelkit.quantize``) and ``modelkit gguf-dir``
(a servable model directory around a GGUF file, ``modelkit.gguf_dir``): their command lines.

Both print the written directory on stdout and everything else on stderr; bad input exits 1
with a one-line message.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("quantize", help="write an int8 W8A8 checkpoint (compressed-tensors, as vLLM reads it)",
                       description="Per-channel int8 weights for every decoder linear layer (SwiftKV's extra "
                                   "projections included), dynamic per-token int8 activations at run time; "
                                   "embedding, norms and lm_head unchanged. Served by the reference engine "
                                   "(int8 GEMMs on CPU) and by vLLM. --smooth applies SmoothQuant first.")
    p.add_argument("--model", default="default", help="model name or HF directory (default: %(default)s)")
    p.add_argument("--output", required=True, help="directory to write")
    p.add_argument("--scheme", choices=["w8a8"], default="w8a8", help="quantization scheme (default: %(default)s)")
    p.add_argument("--smooth", type=float, default=0.0, metavar="ALPHA",
                   help="SmoothQuant migration strength in (0, 1], e.g. 0.5; 0 = off (default: %(default)s)")
    p.add_argument("--calib-tokens", type=int, default=16384, help="calibration tokens for --smooth (default: %(default)s)")
    p.add_argument("--corpus", default=None, help="corpus directory for calibration (default: the local sources)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=run_quantize)

    g = sub.add_parser("gguf-dir", help="make a servable model directory around a GGUF file (--load-format gguf)",
                       description="Writes config.json and the tokenizer read from the GGUF (transformers) and "
                                   "links the file itself (hard link, else a copy): the weights stay in the GGUF, "
                                   "quantized, and `swiftserve-worker --model DIR --load-format gguf` serves them.")
    g.add_argument("gguf", help="the .gguf file")
    g.add_argument("--output", required=True, help="directory to write")
    g.add_argument("--tokenizer-from", default=None, metavar="DIR",
                   help="copy config.json's tokenizer files from this HF directory instead of reading the GGUF's")
    g.set_defaults(func=run_gguf_dir)


def run_quantize(args: argparse.Namespace) -> int:
    from modelkit.models import resolve_model
    from modelkit.prepare import PrepareError
    from modelkit.quantize import quantize_w8a8

    t0 = time.monotonic()
    if args.smooth < 0 or args.smooth > 1:
        print("modelkit quantize: error: --smooth must be in [0, 1]", file=sys.stderr)
        return 1
    try:
        src = resolve_model(args.model)
        out = quantize_w8a8(Path(src), Path(args.output), args.smooth, args.calib_tokens,
                            corpus=Path(args.corpus) if args.corpus else None, progress=not args.quiet)
    except (PrepareError, ValueError, FileNotFoundError) as exc:
        print(f"modelkit quantize: error: {exc}", file=sys.stderr)
        return 1
    print(f"modelkit quantize: W8A8 checkpoint written in {time.monotonic() - t0:.1f}s", file=sys.stderr)
    print(out)
    return 0


def run_gguf_dir(args: argparse.Namespace) -> int:
    from modelkit.gguf_dir import make_gguf_dir

    try:
        out = make_gguf_dir(Path(args.gguf), Path(args.output),
                            Path(args.tokenizer_from) if args.tokenizer_from else None)
    except (ValueError, FileNotFoundError, OSError) as exc:
        print(f"modelkit gguf-dir: error: {exc}", file=sys.stderr)
        return 1
    print(out)
    return 0
