"""What the benchmark scripts' outputs share: the command line that reproduces a result,
and writing the result as a JSON file (parent directories created)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path


def command_line(argv: list[str] | None) -> str:
    """``python <script> <args>`` as run (``argv``: the arguments main() was given, None = sys.argv)."""
    return "python " + shlex.join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])])


def write_json(path: str | Path, doc: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
