"""The suite's three tiers, assigned at collection and enforced while tests run.

- ``fast``: no model, no processes (pure logic, fakes, in-process ASGI apps). A developer's inner
  loop: ``make test-fast``.
- ``model``: loads the real SmolLM2 (or a model built from it) in the test process.
- ``e2e``: starts processes: workers, gateways, vLLM, the CLI, external tools (kubectl, ...).

A test's tier is the highest that applies. ``e2e`` is declared (``pytestmark = pytest.mark.e2e``
in a module that starts processes); ``model`` is derived from the fixtures a test uses
(``MODEL_FIXTURES``, directly or through other fixtures) or declared. Two guards keep the
declarations true: a test outside the e2e tier that starts a process (``subprocess.Popen``,
which ``asyncio``'s subprocesses use too, or ``multiprocessing``; the worker's own constraint
compiler and body-screen children and libraries' machine probes excepted) fails naming the marker to add, and so does a test
outside the model and e2e tiers that prepares the model. ``make test`` runs every tier.
Collection also makes every node id unique (``unique_nodeids``): pytest-xdist, which ``make test``
runs, would run only the first of a repeated one.
"""

from __future__ import annotations

import multiprocessing.process
import subprocess
import traceback
from collections import Counter
from pathlib import Path

import pytest

TIERS = ("fast", "model", "e2e")
MODEL_FIXTURES = frozenset({"smollm2_dir", "zack_dir"})

_current: str | None = None       # the tier of the test running now in this process


def tier_of(item: pytest.Item) -> str:
    if item.get_closest_marker("e2e"):
        return "e2e"
    if item.get_closest_marker("model"):
        return "model"
    return "fast"


def classify(items: list[pytest.Item]) -> None:
    """Mark ``model`` every test whose fixture closure holds a model fixture (and no e2e mark). The
    session keeps pytest's order (tests that share a module's fixtures stay together)."""
    for item in items:
        if tier_of(item) == "fast" and MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.model)


def unique_nodeids(items: list[pytest.Item]) -> None:
    """schemathesis gives the tests it makes for each API operation one node id (the operation is only
    in ``item.name``); pytest-xdist schedules by node id and ran only the first of them (17 of 19 lost,
    silently). Each such item gets its name, operation included, as its node id's last part."""
    repeated = {i for i, n in Counter(item.nodeid for item in items).items() if n > 1}
    for item in items:
        if item.nodeid in repeated:
            new = item.nodeid.rsplit("::", 1)[0] + "::" + item.name
            try:
                from _pytest.nodeid import coerce_node_id      # pytest >= 9 keeps the id as an object
                item._id = coerce_node_id(new)
            except ImportError:
                item._nodeid = new
    left = sorted(i for i, n in Counter(item.nodeid for item in items).items() if n > 1)
    if left:           # a test xdist would not run: fail the collection, never lose it silently
        raise pytest.UsageError(f"tests with the same node id: {left[:5]}")


def enter(item: pytest.Item) -> None:
    global _current
    _current = tier_of(item)


def leave() -> None:
    global _current
    _current = None


def require(tier: str, what: str) -> None:
    """Fail the running test if its tier is below ``tier`` (``what``: the action, for the message)."""
    if _current is None:
        return                    # outside a test (collection, session teardown): not ours to judge
    if TIERS.index(_current) < TIERS.index(tier):
        pytest.fail(f"a {_current}-tier test {what} (at {_caller()}): mark its module "
                    f"`pytestmark = pytest.mark.{tier}` (tests/tier_support.py)", pytrace=False)


_ROOT = str(Path(__file__).resolve().parents[1]) + "/"


def _caller() -> str:
    """The innermost frames of the project's own code (not the library, not this module)."""
    def ours(name: str) -> bool:                 # under the root, outside hidden folders (.venv: the libraries)
        return name.startswith(_ROOT) and not any(p.startswith(".") for p in Path(name[len(_ROOT):]).parts)

    frames = [f for f in traceback.extract_stack()[:-3] if ours(f.filename)]
    return " <- ".join(f"{f.filename[len(_ROOT):]}:{f.lineno}" for f in reversed(frames[-3:])) or "?"


_popen_init = subprocess.Popen.__init__


# Processes every tier may start: the worker's constraint compiler children (``python -m
# worker.constraints``: part of the worker app under test, no model, about a second to start) and its
# large-body screen (``python -m worker.body_screen``: no model, half a second), and
# libraries' own probes of the machine (the openai SDK's ``uname -p``; torch's ``c++ -dumpversion`` and
# ``ninja -v``, which finds the kernel build that ``make test`` made up to date, before loading it;
# matplotlib's ``fc-list``, which it runs once to build its font cache on a machine that has none).
PART_OF_THE_APP = (("-m", "worker.constraints"), ("-m", "worker.body_screen"))
LIBRARY_PROBES = frozenset({"uname", "ninja", "ldconfig", "which", "lscpu", "fc-list"})
VERSION_FLAGS = frozenset({"--version", "-dumpversion", "-dumpfullversion"})


def _allowed(args) -> bool:
    argv = [str(a) for a in args] if isinstance(args, (list, tuple)) else str(args).split()
    if argv and (Path(argv[0]).name in LIBRARY_PROBES or VERSION_FLAGS.intersection(argv[1:])):
        return True
    return any(tuple(argv[i:i + len(p)]) == p for p in PART_OF_THE_APP for i in range(len(argv)))


def _guarded_init(self, args, *rest, **kwargs):
    if not _allowed(args):
        require("e2e", f"starts a process {str(args)[:120]}")
    _popen_init(self, args, *rest, **kwargs)


_process_start = multiprocessing.process.BaseProcess.start


def _guarded_start(self):
    require("e2e", "starts a process")
    _process_start(self)


def install_guards() -> None:
    subprocess.Popen.__init__ = _guarded_init
    multiprocessing.process.BaseProcess.start = _guarded_start
