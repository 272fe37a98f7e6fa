"""``swiftserve bench <concern> <name> [args]`` and ``python -m benchmarks <concern> <name> [args]``.

The concerns and names come from ``benchmarks.lib.registry``. Only the benchmark that runs is
imported: its module adds its own arguments (``add_cli_args``) and runs with them (``main``).
The command line as typed is handed to the benchmark as ``args.command``, which it records
beside its results so that every result names the command that reproduces it.
"""

from __future__ import annotations

import argparse
import importlib
import shlex
import sys

from benchmarks.lib.records import UsageError
from benchmarks.lib.registry import BENCHMARKS, CONCERNS, summary


PROG = "python -m benchmarks"


def overview(prog: str) -> argparse.ArgumentParser:
    """The parser that lists the concerns and, under each, the benchmarks (for --help and errors)."""
    ap = argparse.ArgumentParser(prog=prog, description="The maintained benchmarks, by concern.")
    concerns = ap.add_subparsers(dest="concern", metavar="CONCERN", required=True)
    for concern, names in BENCHMARKS.items():
        sub = concerns.add_parser(concern, help=CONCERNS[concern], description=CONCERNS[concern])
        bench = sub.add_subparsers(dest="name", metavar="NAME", required=True)
        for name, module in names.items():
            bench.add_parser(name, help=summary(module).replace("%", "%%"), add_help=False)
    return ap


def run(concern: str, name: str, argv: list[str] = (), prog: str = PROG):
    """Run one benchmark as the command line does (its arguments parsed, ``args.command`` set) and
    return what its ``main`` returns (tests read the result some benchmarks return)."""
    module = importlib.import_module(BENCHMARKS[concern][name])
    ap = argparse.ArgumentParser(prog=f"{prog} {concern} {name}", description=module.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    module.add_cli_args(ap)
    args = ap.parse_args(list(argv))
    args.command = f"{prog} {shlex.join([concern, name, *argv])}"
    try:
        return module.main(args)
    except UsageError as e:
        ap.error(str(e))


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 2 or argv[0] not in BENCHMARKS or argv[1] not in BENCHMARKS[argv[0]]:
        overview(prog).parse_args(argv[:2] or ["--help"])     # prints the listing or the error, and exits
        return 2
    rc = run(argv[0], argv[1], argv[2:], prog)
    return rc if isinstance(rc, int) else 0
