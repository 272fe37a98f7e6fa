"""vLLM on the GPU machine: the carried site unpacked, checked and importable (there, standard
library and the image's ``packaging`` only; the work runs in subprocesses of the image's Python).

- ``check_requirements(python, checks)``: what ``pip show`` would say of each image package the
  carried distributions need (``vllm_pack.requirement_checks``): its installed version against
  the merged specifier; ``install_overrides`` puts the carried replacement of a failing one into
  its own folder (first on ``PYTHONPATH``), and only of a failing one.
- ``unpack(archives, site)``: each complete archive into ``site``, several at once, each once
  (``site/.unpacked.json`` records the sha256 of what was unpacked; a call cut short resumes).
- ``write_plugin_dist(root, dest)``: the project's ``vllm.general_plugins`` entry point (read from
  pyproject.toml) as a dist-info in ``dest``: vLLM loads plugins by entry point in every process,
  and the tree that travels is not installed there.
- ``import_check(python, env)``: imports vLLM with the plugin registered, as vLLM's processes do.
- ``vllm_environ(paths)``: the environment of every vLLM process of the session.
"""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
import tomllib
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from gpubundle.park import sha256_file
from gpubundle.payloads import install_wheels

UNPACKED = ".unpacked.json"
PLUGIN_DIST = "swiftserve_vllm_plugin"

_CHECK = """
import json, sys, importlib.metadata as md
from packaging.specifiers import SpecifierSet
out = []
for c in json.loads(sys.argv[1]):
    try:
        have = md.version(c["name"])
    except md.PackageNotFoundError:
        have = None
    ok = have is not None and SpecifierSet(c["specifier"]).contains(have, prereleases=True)
    out.append({**c, "installed": have, "ok": ok})
print(json.dumps(out))
"""

_IMPORT = """
import json, sys
from importlib.metadata import entry_points
import torch, vllm
plugins = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm import ModelRegistry
from swiftserve_vllm import ARCHITECTURES
from swiftserve_vllm.version import installed
archs = set(ModelRegistry.get_supported_archs())
print(json.dumps({"vllm": vllm.__version__, "vllm_file": vllm.__file__, "distribution": installed(), "plugins": plugins,
                  "registered": [a for a in ARCHITECTURES if a in archs], "cuda": torch.cuda.is_available()}))
"""


def check_requirements(python: str, checks: list[dict], env: dict | None = None) -> list[dict]:
    """Each check with ``installed`` (None: absent) and ``ok``, as ``python`` sees its packages."""
    if not checks:
        return []
    res = subprocess.run([python, "-c", _CHECK, json.dumps(checks)], capture_output=True, text=True, env=env)
    if res.returncode != 0:
        raise RuntimeError(f"checking the image's packages failed: {res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def install_overrides(python: str, results: list[dict], wheels: dict[str, Path], dest: Path) -> list[str]:
    """Install the carried wheel of every failing check into ``dest``; the names installed."""
    todo = [wheels[r["name"]] for r in results if not r["ok"] and r["name"] in wheels]
    if todo:
        install_wheels(todo, dest, python)
    return [w.name for w in todo]


def _extract(job: tuple[str, str]) -> str:
    archive, site = job
    with tarfile.open(archive, "r:xz") as tar:
        members = tar.getmembers()
        # Archives extracted at once share folders: make them first, race-free (tarfile's own makedirs
        # fails when another process made the folder between its check and its call).
        for d in {os.path.dirname(m.name) for m in members} - {""}:
            os.makedirs(os.path.join(site, d), exist_ok=True)
        tar.extractall(site, members=members, filter="data")
    return archive


def unpack(archives: dict[str, Path], site: Path, workers: int = 4) -> list[str]:
    """Unpack every archive of ``archives`` (name -> joined, verified file) not yet unpacked into
    ``site``; the names unpacked by this call."""
    site.mkdir(parents=True, exist_ok=True)
    record = site / UNPACKED
    done = json.loads(record.read_text()) if record.is_file() else {}
    digests = {name: sha256_file(path) for name, path in archives.items()}
    todo = [name for name in archives if done.get(name) != digests[name]]
    if todo:
        with ProcessPoolExecutor(max_workers=max(1, min(workers, len(todo)))) as ex:
            for path in ex.map(_extract, [(str(archives[n]), str(site)) for n in todo]):
                name = Path(path).name
                done[name] = digests[name]
                record.write_text(json.dumps(done, indent=1))     # per archive: a cut-short call resumes
    return todo


def plugin_entry_points(root: Path) -> dict[str, str]:
    """The project's ``vllm.general_plugins`` entry points (name -> object reference), from pyproject."""
    doc = tomllib.loads((root / "pyproject.toml").read_text())
    return dict(doc["project"]["entry-points"]["vllm.general_plugins"])


def write_plugin_dist(root: Path, dest: Path) -> Path:
    """A dist-info in ``dest`` declaring the project's vLLM plugin (idempotent); its folder."""
    doc = tomllib.loads((root / "pyproject.toml").read_text())
    version = doc["project"]["version"]
    info = dest / f"{PLUGIN_DIST}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PLUGIN_DIST.replace('_', '-')}\n"
                                   f"Version: {version}\nSummary: SwiftServe's vLLM plugin (the tree on PYTHONPATH)\n")
    lines = "".join(f"{k} = {v}\n" for k, v in plugin_entry_points(root).items())
    (info / "entry_points.txt").write_text(f"[vllm.general_plugins]\n{lines}")
    (info / "RECORD").write_text("")
    return info


def import_check(python: str, env: dict, cwd: Path) -> dict:
    """``import vllm`` with the plugin loaded as vLLM loads it; what was found (raises on failure)."""
    res = subprocess.run([python, "-c", _IMPORT], capture_output=True, text=True, env=env, cwd=cwd)
    if res.returncode != 0:
        raise RuntimeError(f"import vllm with the plugin failed:\n{res.stderr[-4000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def vllm_environ(base: dict, paths: list[str]) -> dict:
    """``base`` with ``paths`` first on PYTHONPATH and the settings every vLLM process of the session
    takes: no network (offline hubs, no usage report), and vLLM's sampler without FlashInfer, whose
    kernels would be compiled at run time (minutes) by a toolchain the pack does not carry."""
    pythonpath = os.pathsep.join([*paths, *[p for p in base.get("PYTHONPATH", "").split(os.pathsep) if p]])
    return {**base, "PYTHONPATH": pythonpath, "VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
