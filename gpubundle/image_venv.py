"""A venv here shaped like the GPU machine's image, and what vLLM needs beyond it.

``build_image_venv(python, dest)``: a venv of ``python`` (a CPython ``image.PYTHON``) holding the
image's known versions (``image.KNOWN``, the torch 2.11 CUDA stack among them), then, round by
round, the image packages that installing vLLM would add (``resolve`` names them; latest versions
within ``KNOWN``), and finally without any distribution the image does not ship (a dependency of
an image package that the image itself lacks, e.g. pydantic pulled in by a newer typer). So pip,
asked there what installing vLLM takes, answers what the GPU machine lacks. Several GB of
downloads the first time; reused while ``dest`` holds a complete build (its ``.built`` marker).

``resolve(python, spec)``: ``pip install --dry-run --report`` of ``spec`` in that venv: every
distribution pip would install, as ``Need(name, version, in_image, installed)``; ``installed`` is
the version the venv holds when pip would replace an image package.

The venv serves the pack (``vllm_pack``) and the heavy self-test (``make gpu-vllm-selftest``); the
test suite never builds it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gpubundle import image

MARKER = ".built"


class ImageVenvError(RuntimeError):
    pass


@dataclass(frozen=True)
class Need:
    name: str                      # normalised
    version: str
    in_image: bool
    installed: str | None = None   # the venv's version of an image package pip would replace


def venv_python(dest: Path) -> Path:
    return Path(dest) / "bin" / "python"


def _pip(py: Path, *args: str, quiet: bool = True) -> None:
    cmd = [str(py), "-m", "pip", *(["-q"] if quiet else []), *args]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise ImageVenvError(f"{' '.join(cmd[:6])} ... failed:\n{res.stderr[-3000:]}")


def installed(py: Path) -> dict[str, str]:
    """Normalised name -> version of every distribution in ``py``'s environment."""
    code = ("import json, importlib.metadata as m\n"
            "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions() if d.metadata['Name']}))")
    out = subprocess.run([str(py), "-c", code], check=True, capture_output=True, text=True).stdout
    return {image.normalize(k): v for k, v in json.loads(out).items()}


def resolve(py: str | Path, spec: str) -> list[Need]:
    """What ``pip install spec`` would install into ``py``'s environment (nothing is installed)."""
    py = Path(py)
    have = installed(py)
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        _pip(py, "install", "--dry-run", "--report", str(report), spec)
        items = json.loads(report.read_text())["install"]
    needs = []
    for it in items:
        name = image.normalize(it["metadata"]["name"])
        needs.append(Need(name, it["metadata"]["version"], image.in_image(name), have.get(name)))
    return needs


def _constraints(dest: Path) -> Path:
    path = dest / "image-constraints.txt"
    path.write_text("".join(f"{n}=={v}\n" for n, v in sorted(image.KNOWN.items())))
    return path


def _prune(py: Path) -> list[str]:
    """Uninstall what the image does not ship (pip's own tools stay)."""
    extra = sorted(n for n in installed(py) if not image.in_image(n) and n not in ("pip", "setuptools", "wheel"))
    if extra:
        _pip(py, "uninstall", "-y", *extra)
    return extra


def build_image_venv(python: str, dest: str | Path, probe_spec: str, rounds: int = 4) -> Path:
    """The image-shaped venv at ``dest`` (built once); ``probe_spec`` (e.g. ``vllm==0.26.0``) decides
    which of the image's other packages matter: those its install would add."""
    dest = Path(dest)
    py = venv_python(dest)
    if (dest / MARKER).is_file() and py.is_file():
        return py
    if shutil.which(python) is None:
        raise ImageVenvError(f"no Python at {python!r}: the image-shaped venv needs a Python {image.PYTHON} "
                             "(GPU_IMAGE_PYTHON=path/to/python3.12)")
    ver = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], check=True,
                         capture_output=True, text=True).stdout.strip()
    if ver != image.PYTHON:
        raise ImageVenvError(f"{python} is Python {ver}; the GPU image runs {image.PYTHON} "
                             "(GPU_IMAGE_PYTHON=path/to/python3.12)")
    subprocess.run([python, "-m", "venv", str(dest)], check=True)
    _pip(py, "install", "--upgrade", "pip>=24")
    cons = _constraints(dest)
    _pip(py, "install", "-c", str(cons), *sorted(f"{n}=={v}" for n, v in image.KNOWN.items()), *image.SESSION)
    for _ in range(rounds):
        _prune(py)
        add = sorted(n.name for n in resolve(py, probe_spec) if n.in_image and n.installed is None
                     and n.name not in image.NEVER_CARRY)
        if not add:
            break
        _pip(py, "install", "-c", str(cons), *add)
    else:
        raise ImageVenvError(f"image packages still missing after {rounds} rounds")
    _prune(py)
    (dest / MARKER).write_text(json.dumps({"python": sys.version.split()[0], "probe": probe_spec,
                                           "packages": installed(py)}, indent=1))
    return py
