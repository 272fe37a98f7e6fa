"""The benchmark harness (benchmarks/lib, benchmarks/cli.py): A/B rounds and ratios, merging a run's
keys into summary.json, and the command line: every registered benchmark parses its own arguments,
the listing imports none of them, and each run is handed the command that reproduces it."""

import json
import sys
from pathlib import Path

import pytest

from benchmarks import cli
from benchmarks.lib.ab import interleaved, medians, paired_ratio
from benchmarks.lib.records import merge_json
from benchmarks.lib.registry import BENCHMARKS, CONCERNS, summary



def test_interleaved_rotates_the_order_every_round():
    seen = []
    out = interleaved(["a", "b", "c"], 4, lambda name, r: seen.append((r, name)) or f"{name}{r}")
    assert [n for r, n in seen if r == 0] == ["a", "b", "c"] and [n for r, n in seen if r == 1] == ["b", "c", "a"]
    assert [n for r, n in seen if r == 3] == ["a", "b", "c"]
    assert out == {"a": ["a0", "a1", "a2", "a3"], "b": ["b0", "b1", "b2", "b3"], "c": ["c0", "c1", "c2", "c3"]}


def test_paired_ratio_cancels_what_a_round_does_to_both():
    base, new = [1.0, 2.0, 4.0], [1.5, 3.0, 6.0]          # the machine slows down, new stays 1.5x base
    assert paired_ratio(new, base) == 1.5
    assert medians([{"t": 1.0, "p": None}, {"t": 3.0, "p": None}, {"t": 2.0, "p": None}], ("t", "p")) == {"t": 2.0}


def test_merge_json_keeps_other_keys(tmp_path):
    path = tmp_path / "summary.json"
    assert merge_json(path, {"a": 1}) == {"a": 1}
    path.write_text(json.dumps({"a": 0, "b": 2}))
    assert merge_json(path, {"a": 1}, indent=2) == {"a": 1, "b": 2}
    assert json.loads(path.read_text()) == {"a": 1, "b": 2} and path.read_text().startswith('{\n  "a"')


def test_every_benchmark_is_a_module_with_add_cli_args_and_main():
    import ast
    import importlib.util

    assert set(BENCHMARKS) == set(CONCERNS)
    for concern, names in BENCHMARKS.items():
        for name, module in names.items():
            tree = ast.parse(Path(importlib.util.find_spec(module).origin).read_text())
            defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
            assert {"add_cli_args", "main"} <= defined, module
            assert summary(module), f"{module} has no docstring"


def test_the_listing_imports_no_benchmark(capsys):
    before = set(sys.modules)
    with pytest.raises(SystemExit) as e:
        cli.main(["serve", "--help"])
    assert e.value.code == 0 and "suite" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    new = {m for m in set(sys.modules) - before if m.startswith("benchmarks.") and not m.startswith("benchmarks.lib.")}
    assert new <= {"benchmarks.cli"}, new


def test_a_run_gets_its_command_line_and_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["engine", "ab"])                  # A == B: refused before any model loads
    assert e.value.code == 2 and "same configuration" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.main(["nothing", "here"])
    assert e.value.code == 2
    seen = {}
    module = __import__("benchmarks.report.gateway", fromlist=["main"])
    real = module.main
    try:
        module.main = lambda args: seen.setdefault("command", args.command) and 0
        assert cli.main(["report", "gateway", "some dir"], prog="swiftserve bench") == 0
    finally:
        module.main = real
    assert seen["command"] == "swiftserve bench report gateway 'some dir'"


def test_swiftserve_bench_hands_its_arguments_to_the_benchmarks(capsys):
    from swiftserve.cli import main as swiftserve

    with pytest.raises(SystemExit) as e:
        swiftserve(["bench", "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and out.startswith("usage: swiftserve bench") and all(c in out for c in CONCERNS)
    with pytest.raises(SystemExit) as e:
        swiftserve(["bench", "kernel", "attention", "--help"])
    assert e.value.code == 0 and "--prefill-len" in capsys.readouterr().out
