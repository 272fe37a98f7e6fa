"""Print the requirements of pyproject.toml's base dependencies plus chosen extras.

Used by the Dockerfile to install dependencies in a layer of their own, before the
source is copied, so that a code change does not reinstall torch. Extras that name
the project itself (``swiftserve[engine]``) are expanded recursively.

    python pyproject_requirements.py pyproject.toml [EXTRA ...]   # one requirement per line

Standard library only (it runs before anything is installed). Exit status 2 for an
unknown extra, so a renamed extra fails the image build instead of installing less.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?\s*(.*)$")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(pyproject: dict, extras: list[str]) -> list[str]:
    """Base dependencies + the requirements of ``extras``, self-references expanded, order kept, no duplicates."""
    project = pyproject["project"]
    me = _norm(project["name"])
    optional = project.get("optional-dependencies", {})
    out: list[str] = []
    seen_extras: set[str] = set()

    def add(reqs: list[str]) -> None:
        for req in reqs:
            m = _NAME.match(req)
            if m and _norm(m.group(1)) == me:
                for extra in (e.strip() for e in (m.group(2) or "").split(",")):
                    if extra:
                        add_extra(extra)
            elif req not in out:
                out.append(req)

    def add_extra(extra: str) -> None:
        if extra in seen_extras:
            return
        if extra not in optional:
            raise KeyError(extra)
        seen_extras.add(extra)
        add(optional[extra])

    add(project.get("dependencies", []))
    for extra in extras:
        add_extra(extra)
    return out


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stderr)
        return 0 if argv else 2
    data = tomllib.loads(Path(argv[0]).read_text())
    try:
        reqs = requirements(data, argv[1:])
    except KeyError as exc:
        known = ", ".join(sorted(data["project"].get("optional-dependencies", {})))
        print(f"pyproject_requirements: unknown extra {exc.args[0]!r} (known: {known})", file=sys.stderr)
        return 2
    print("\n".join(reqs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
