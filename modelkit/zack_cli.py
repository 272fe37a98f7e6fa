"""``modelkit zack-calibrate``: calibrate ZACK on a model and write a servable ZACK model directory.

The output directory holds the calibration (``zack.json``: record + singular values;
``zack.safetensors``: rotations, see ``refengine.kv.methods.zack.format``) and is itself a
model directory: the base model's weights hard-linked (or copied), its tokenizer
files, a weight index that leaves the rotations out, and ``config.json`` with a
``"zack"`` object holding per-head ranks for ``--rate`` / ``--mode``. Serve it with
``swiftserve-worker --model DIR``; ``--kv-methods '{"zack": {"rate": R}}'`` re-plans
the ranks at start-up from the stored singular values without recalibrating.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from modelkit.models import resolve_model
from modelkit.zack import write_zack_model


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("zack-calibrate", help="ZACK: calibrate K/V rotations and write a servable ZACK model",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="default", help="model dir or known name (default: %(default)s)")
    p.add_argument("--output", required=True, help="directory to write (calibration + servable model)")
    p.add_argument("--tokens", type=int, default=32768, help="calibration tokens (the paper: >= 16K)")
    p.add_argument("--seq-len", type=int, default=512, help="tokens per calibration sequence")
    p.add_argument("--seed", type=int, default=0, help="document shuffling seed")
    p.add_argument("--basis", choices=["whitened", "stacked"], default="whitened",
                   help="'whitened': second-moment optimal query/key and value/output maps (lower loss at every "
                        "rate on SmolLM2, results/zack/); 'stacked': the paper's shared rotations (SVD of Q "
                        "stacked with K, V with W_o)")
    p.add_argument("--weighting", choices=["plain", "balanced"], default="plain",
                   help="stacked basis: the paper's plain stacking, or each block scaled to unit trace")
    p.add_argument("--corpus", default=None,
                   help="corpus directory whose training split to use (default: read the sources directly)")
    p.add_argument("--rate", type=float, default=0.5, help="overall KV compression rate of the served ranks")
    p.add_argument("--mode", choices=["adaptive", "uniform"], default="adaptive", help="rank allocation")
    p.add_argument("--rank-multiple", type=int, default=1, help="round ranks up to a multiple of this")
    p.add_argument("--no-swiftkv", dest="swiftkv", action="store_false",
                   help="calibrate a SwiftKV checkpoint as its baseline model")
    p.add_argument("--batch", type=int, default=32, help="sequences per engine batch")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from safetensors.torch import save_file

    from modelkit.zack_calibrate import calibrate
    from refengine.kv.methods.zack.format import CALIBRATION_FILE, ROTATIONS_FILE

    if args.tokens < 1024 or args.seq_len < 16 or args.batch < 1:
        raise SystemExit("zack-calibrate: --tokens must be >= 1024, --seq-len >= 16, --batch >= 1")
    if not 0.0 <= args.rate < 1.0 or args.rank_multiple < 1:
        raise SystemExit("zack-calibrate: --rate must be in [0, 1) and --rank-multiple >= 1")
    base = resolve_model(args.model)
    out = Path(args.output)
    if out.resolve() == Path(base).resolve():
        raise SystemExit("zack-calibrate: --output must differ from the model directory")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    record, tensors = calibrate(Path(base), args.tokens, args.seq_len, args.seed, args.swiftkv, args.basis,
                                args.weighting, Path(args.corpus) if args.corpus else None, args.batch)
    record["calibration"]["seconds"] = round(time.time() - t0, 1)
    save_file(tensors, str(out / ROTATIONS_FILE), metadata={"format": "pt"})
    (out / CALIBRATION_FILE).write_text(json.dumps(record, indent=1))
    zack = write_zack_model(Path(base), out, args.rate, args.mode, args.rank_multiple, args.swiftkv)
    print(f"ZACK calibration of {Path(base).name}: {record['calibration']['tokens']} tokens in "
          f"{record['calibration']['seconds']} s; served ranks: {zack['mode']} rate {zack['rate']:.3f} -> {out}")
    return 0
