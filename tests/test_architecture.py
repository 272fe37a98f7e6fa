"""The import layers of docs/architecture.md hold: no upward import, no circle, one worker seam.

The checker (tests/import_layers_support.py) reads the source with ``ast``, so imports inside
functions count; its own rules are tested on small synthetic trees first, so that a checker
that stopped seeing anything would fail here rather than pass every tree.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from import_layers_support import ALLOWED, PRODUCT, check

ROOT = Path(__file__).resolve().parent.parent


def test_the_project_keeps_its_import_layers():
    problems = check(ROOT)
    assert not problems, "imports against docs/architecture.md:\n" + "\n".join(problems)


def test_every_top_level_package_has_a_layer():
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert packages - set(ALLOWED) == set(), "a new top-level package needs a line in ALLOWED and the docs"


def test_the_product_never_imports_the_lab_and_the_wheel_ships_only_the_product():
    lab = set(ALLOWED) - PRODUCT
    assert {"gpubundle", "studies"} <= lab
    assert all(not (ALLOWED[p] & lab) for p in PRODUCT), "a product package may not import lab tooling"
    assert all(PRODUCT <= ALLOWED[p] | {p} for p in lab), "lab tooling sits above every product package"
    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert {p.rstrip("*") for p in find["include"]} == PRODUCT and {p.rstrip("*") for p in find["exclude"]} == lab


def test_swiftcommon_version_is_pyprojects():
    from swiftcommon.version import __version__

    declared = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert __version__ == declared


# ---- the checker on synthetic trees ------------------------------------------------------------
def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


RULES = {"low": frozenset(), "high": frozenset({"low"}), "app": frozenset({"low", "high"})}


def test_checker_names_an_upward_import_even_inside_a_function(tmp_path):
    root = _tree(tmp_path, {"low/__init__.py": "", "low/a.py": "def f():\n    from high import b\n",
                            "high/__init__.py": "", "high/b.py": "import low.a\n", "app/__init__.py": ""})
    (problem,) = check(root, RULES, {}, {})
    assert problem.startswith("low/a.py:2: low may not import high.b")


def test_checker_finds_a_circle_through_relative_and_function_level_imports(tmp_path):
    root = _tree(tmp_path, {"low/__init__.py": "", "high/__init__.py": "", "app/__init__.py": "",
                            "high/x.py": "from . import y\n", "high/y.py": "def g():\n    from .z import h\n",
                            "high/z.py": "from high.x import thing\n", "high/free.py": "from high import x\n"})
    (problem,) = check(root, RULES, {}, {})
    assert problem.startswith("import circle between high.x, high.y, high.z:")
    assert "high/y.py:2 imports high.z.h" in problem


def test_checker_holds_a_seam_and_forbidden_third_party_packages(tmp_path):
    root = _tree(tmp_path, {"low/__init__.py": "", "high/__init__.py": "", "app/__init__.py": "",
                            "app/seam.py": "import high\n", "app/other.py": "from high import thing\n",
                            "low/engine.py": "import vllm.config\n"})
    problems = check(root, RULES, {("app", "high"): frozenset({"app.seam"})}, {"low": frozenset({"vllm"})})
    assert sorted(problems) == ["app/other.py:1: high.thing is reached only through app.seam, not from app.other",
                                "low/engine.py:1: low must not import vllm.config"]


def test_checker_accepts_a_clean_tree(tmp_path):
    root = _tree(tmp_path, {"low/__init__.py": "import os\n", "high/__init__.py": "from low import x\n",
                            "app/__init__.py": "", "app/main.py": "import high\nimport low\nfrom . import helpers\n",
                            "app/helpers.py": "from app import nothing_here\n"})
    # app.helpers -> app (the package __init__) and app.main -> app.helpers: no circle.
    assert check(root, RULES, {}, {}) == []
