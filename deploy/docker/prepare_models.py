"""Bake models into an image at build time: ``prepare_models.py --dest DIR NAME ...``.

Each NAME is what ``python -m worker --model`` accepts by name: ``default`` (the
embedded SmolLM2-135M-Instruct, prepared by ``modelkit prepare``) or a shipped SwiftKV
variant (``modelkit.shipped``; its tensors are read from the source tree's
``checkpoints/``, so the Dockerfile runs this with ``PYTHONPATH=/src``). Models are
prepared in the cache (``SWIFTSERVE_CACHE``, a scratch directory of the build stage
that is not copied on) and then copied to ``DEST/<model name>/`` with ``cp -a`` in one
call, which keeps the hard links a SwiftKV variant shares with its base model.

The Dockerfile uses ``--dest /models/models`` and the final image sets
``SWIFTSERVE_CACHE=/models``, so ``--model default`` finds the baked directory (a valid
prepared directory is used as is, read-only) and never needs the network; a baked
variant is served by its path, ``--model /models/models/<variant>``. No NAME: nothing
is baked (DEST is created empty).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Prepare models in the cache and copy them to DEST.")
    p.add_argument("--dest", required=True, help="directory that receives one sub-directory per model")
    p.add_argument("names", nargs="*", help="'default' and/or shipped variant names")
    args = p.parse_args(argv)
    dest = Path(args.dest)
    dest.mkdir(parents=True, exist_ok=True)
    if not args.names:
        print("prepare_models: nothing to bake", file=sys.stderr)
        return 0
    from modelkit.models import resolve_model
    from modelkit.prepare import PrepareError

    dirs: list[Path] = []
    for name in args.names:
        try:
            path = resolve_model(name)
        except PrepareError as exc:
            print(f"prepare_models: {name}: {exc}", file=sys.stderr)
            return 1
        if path not in dirs:
            dirs.append(path)
        print(f"prepare_models: {name} -> {path}", file=sys.stderr)
    # Base model first: materialised variants hard-link its weights.
    subprocess.run(["cp", "-a", *map(str, dirs), str(dest)], check=True)
    for d in dirs:
        print(dest / d.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
