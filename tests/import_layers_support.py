"""The import-layer checker behind tests/test_architecture.py (docs/architecture.md).

It reads the source with ``ast`` (nothing is imported), so an import inside a function counts
exactly like one at the top of a file: both are arrows in the graph. Contract:
``check(root)`` returns one line per broken rule, naming the file and the import; an empty
list means the tree keeps the layers. The rules are data (``ALLOWED``, ``SEAMS``) so a
synthetic tree can be checked with other rules in the checker's own unit test.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

# The packages the wheel ships (pyproject's packages.find); everything else in ALLOWED is lab tooling.
PRODUCT = frozenset({"swiftcommon", "refengine", "modelkit", "swiftserve_vllm", "gateway", "loadtest", "worker",
                     "benchmarks", "swiftserve"})
# Which top-level packages each package may import besides itself (docs/architecture.md),
# lowest layer first. A package missing here is not checked (tests/, deploy/).
ALLOWED: dict[str, frozenset[str]] = {
    "swiftcommon": frozenset(),
    "refengine": frozenset({"swiftcommon"}),
    "modelkit": frozenset({"refengine", "swiftcommon"}),
    "swiftserve_vllm": frozenset({"modelkit", "refengine", "swiftcommon"}),
    "gateway": frozenset({"swiftcommon"}),
    "loadtest": frozenset({"swiftcommon"}),
    "worker": frozenset({"refengine", "modelkit", "swiftcommon", "swiftserve_vllm"}),
    # The maintained benchmarks (`swiftserve bench`): over every package that serves, under the command.
    "benchmarks": frozenset({"swiftcommon", "refengine", "modelkit", "swiftserve_vllm", "gateway", "loadtest",
                             "worker"}),
    "swiftserve": frozenset({"swiftcommon", "refengine", "modelkit", "swiftserve_vllm", "gateway", "loadtest",
                             "worker", "benchmarks"}),
    # The lab beside the product (the offline GPU validation bundle, not in the wheel): above every
    # product package; none of them may import it (it is in no product package's set above).
    "gpubundle": PRODUCT,
    # One-off studies (comparisons run once to answer a question): lab too, outside the wheel.
    "studies": PRODUCT,
}
# (importing package, imported package) -> the only modules of the importer allowed that arrow.
SEAMS: dict[tuple[str, str], frozenset[str]] = {
    ("worker", "swiftserve_vllm"): frozenset({"worker.backends.vllm"}),
}
# Third-party packages a project package must never import (the reference engine runs without vLLM).
FORBIDDEN_THIRD_PARTY: dict[str, frozenset[str]] = {
    "refengine": frozenset({"vllm"}),
}


@dataclass(frozen=True)
class Arrow:
    """One import: ``source`` module imports ``target`` (a dotted name) at ``path:line``."""
    source: str
    target: str
    path: str
    line: int


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _absolute(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The dotted name a (possibly relative) ``from ... import`` names."""
    if level == 0:
        return name or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def arrows_of(root: Path, path: Path) -> list[Arrow]:
    """Every import in one file, wherever it stands (module level, function, class, try/if)."""
    module = module_name(root, path)
    is_package = path.name == "__init__.py"
    rel = str(path.relative_to(root))
    out: list[Arrow] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=rel)):
        if isinstance(node, ast.Import):
            out += [Arrow(module, alias.name, rel, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, is_package, node.level, node.module)
            # `from pkg import name`: name may be a submodule or an attribute; _resolve keeps the
            # longest prefix that is a module, so the arrow goes to the submodule when there is one.
            out += [Arrow(module, base if alias.name == "*" else f"{base}.{alias.name}", rel, node.lineno)
                    for alias in node.names]
    return out


def _resolve(target: str, modules: set[str]) -> str | None:
    """The longest project module a dotted name starts with (None: not a project module)."""
    parts = target.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in modules:
            return ".".join(parts[:n])
    return None


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module, or a module importing itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:           # iterative Tarjan: deep packages must not hit recursion limits
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1 or node in graph[node]:
                    found.append(sorted(comp))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return found


def check(root: Path, allowed: dict[str, frozenset[str]] = ALLOWED,
          seams: dict[tuple[str, str], frozenset[str]] = SEAMS,
          forbidden: dict[str, frozenset[str]] = FORBIDDEN_THIRD_PARTY) -> list[str]:
    """Every broken rule under ``root`` for the packages named in ``allowed``, one line each."""
    files = {module_name(root, p): p for pkg in allowed for p in sorted((root / pkg).rglob("*.py"))}
    modules = set(files)
    problems: list[str] = []
    graph: dict[str, set[str]] = {m: set() for m in modules}
    where: dict[tuple[str, str], Arrow] = {}
    for module, path in files.items():
        package = module.split(".")[0]
        for arrow in arrows_of(root, path):
            top = arrow.target.split(".")[0]
            if top in forbidden.get(package, ()):
                problems.append(f"{arrow.path}:{arrow.line}: {package} must not import {arrow.target}")
                continue
            target = _resolve(arrow.target, modules)
            if target is None:
                continue                       # standard library or third party
            if top != package and top not in allowed[package]:
                problems.append(f"{arrow.path}:{arrow.line}: {package} may not import {arrow.target} "
                                f"(layer rule: {package} imports only {sorted(allowed[package]) or 'nothing'})")
                continue
            seam = seams.get((package, top))
            if seam is not None and module not in seam:
                problems.append(f"{arrow.path}:{arrow.line}: {arrow.target} is reached only through "
                                f"{', '.join(sorted(seam))}, not from {module}")
                continue
            if target != module:
                graph[module].add(target)
                where.setdefault((module, target), arrow)
    for comp in _cycles(graph):
        members = set(comp)
        edges = [where[(a, b)] for a in comp for b in sorted(graph[a]) if b in members]
        problems.append("import circle between " + ", ".join(comp) + ": "
                        + "; ".join(f"{e.path}:{e.line} imports {e.target}" for e in edges))
    return problems
