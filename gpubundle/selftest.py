"""``gpu-check``'s CPU self-test: a whole GPU session, tiny, on this machine.

1. The tree that travels (``limits.tree_files``: tracked and untracked, not ignored, files on
   disk) is copied into a fresh git repository; the real checkout is never parked. There
   ``park.park`` takes the checkpoint tensors out (each recorded with the sha256 of the real
   checkout's file), the tree shrinks by exactly those bytes, ``make gpu-park-guard`` (for
   scripts that need the whole tree) stops naming ``make gpu-unpark``, parking again moves nothing, and
   the part size is planned from the parked tree (``plan.plan_parts``); ``plan.shipped_file``
   reads a shipped tensor file from ``.gpu-park/``.
2. A tiny random Llama, random token windows and "shipped" SwiftKV tensors of it (the papers'
   initialisation plus noise, for l=2 and g=1, 2) are packed into parts small enough that the
   model spans several (with ``wheels``, those first, in larger parts: the env stage installs
   them when the interpreter lacks a module). Three ``run_check`` calls, in the parked copy, play a session
   whose parts arrive one command at a time:
   1. only ``part1``: ``env`` done, ``model`` waiting for the other parts (the shipped tensors,
      in part1, already placed), ``tests`` waiting for it, ``bench`` (``benchmarks engine gpu --tiny``)
      done, ``distill`` waiting, the vLLM stages skipped (this pack carries no vLLM);
   2. every part: the model is joined and checked, ``tests`` (``tests/gpu``: skipped without
      CUDA) run now that it is there,
      ``distill`` starts from the carried shipped tensors (``--init`` their folder; its saved
      starting point equals them) and stops after its first step with a checkpoint;
   3. the same command: ``distill`` resumes and finishes; the output folder holds the SwiftKV
      tensors of both group sizes and passes the size check.
3. The ``vllm`` stage on a stub vLLM (a ``vllm`` package that imports and loads plugins by entry
   point but registers nothing, in two archives over two parts, with a check on a package the
   interpreter lacks and a carried wheel for it): with part1 it unpacks the first archive and
   waits; with both, it unpacks the second, installs the carried wheel only for the failing
   check, declares the plugin's entry point through the dist-info it writes (found by ``import
   vllm``'s process as ``swiftserve = swiftserve_vllm:register``), and fails because no model class
   was registered. (The real vLLM path runs in ``make gpu-vllm-selftest``.)
4. ``park.unpark`` refuses while a different file sits where a parked one belongs, then puts
   every file back with its sha256 checked: ``git status`` of the copy is clean, the guard is
   quiet, and unparking again does nothing.
Each expectation that fails raises ``SelfTestError``; ``run_selftest`` returns what it saw.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from gpubundle import park, payloads
from gpubundle.limits import MIB, out_problems, tree_bytes, tree_files
from gpubundle.pack import assemble, build_pack
from gpubundle.plan import SHIPPED, plan_parts, shipped_file
from gpubundle.random_model import TINY, write_random_llama
from gpubundle.session import SessionConfig, run_check

ROOT = Path(__file__).resolve().parents[1]
BENCH = ("--tiny --device cpu --dtype float32 --repeats 1 --decode-steps 4 --prefill-tokens 64 --context 32 "
         "--batches 1 2 --cpu-kernels torch")
SHIPPED_REL = "tiny-swiftkv"          # the tiny "shipped" tensors' folder under checkpoints/
GIT = ["git", "-c", "user.name=selftest", "-c", "user.email=selftest@invalid", "-c", "commit.gpgsign=false",
       "-c", "core.hooksPath=/dev/null"]


class SelfTestError(AssertionError):
    pass


def _expect(cond: bool, what: str, seen) -> None:
    if not cond:
        raise SelfTestError(f"{what}; saw {seen}")


def commit_all(repo: Path) -> Path:
    """``repo``'s files as the one commit of a new git repository there."""
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "tree copy"]):
        subprocess.run([*GIT, "-C", str(repo), *cmd], check=True, capture_output=True)
    return repo


def copy_tree(root: Path, dest: Path) -> Path:
    """The files that travel from ``root``, copied into ``dest`` as a fresh repository (one commit)."""
    for f in tree_files(root):
        target = dest / f.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, target)
    return commit_all(dest)


def _git_status(tree: Path) -> str:
    return subprocess.run(["git", "-C", str(tree), "status", "--porcelain"], check=True, capture_output=True,
                          text=True).stdout


def _park_half(root: Path, tree: Path, seen: dict) -> dict:
    before, loose = tree_bytes(tree), park.parkable(tree)
    _expect(bool(loose) and park.guard(tree) is None, "the copy has checkpoint tensors and nothing parked", loose)
    res = park.park(tree)
    _expect(res["moved"] == loose and res["already"] == [], "parking moves every parkable file", res)
    entries = park.read_manifest(tree)["files"]
    _expect(all(entries[n]["sha256"] == park.sha256_file(root / n) for n in loose if (root / n).is_file()),
            "the manifest records the checkout's sha256", entries)
    after = tree_bytes(tree)
    _expect(before - after == res["bytes"] and park.parkable(tree) == [], "the tree shrinks by the parked bytes",
            (before, after, res["bytes"]))
    why = park.guard(tree) or ""
    _expect("make gpu-unpark" in why, "the guard names make gpu-unpark", why)
    make = subprocess.run(["make", "-s", "-C", str(tree), "gpu-park-guard", f"PY={sys.executable}"],
                          capture_output=True, text=True)
    _expect(make.returncode != 0 and "make gpu-unpark" in make.stderr, "make gpu-park-guard stops",
            (make.returncode, make.stderr))
    again = park.park(tree)
    _expect(again["moved"] == [] and again["already"] == loose, "parking again moves nothing", again)
    plan = plan_parts(tree, 64.0, 4.0)
    _expect(plan["part_bytes"] == 64 * MIB - after - 4 * MIB and plan["parked"] == loose,
            "parts are sized from the parked tree", plan)
    carried = [r for r in SHIPPED if f"{park.SCOPE}/{r}" in loose]
    if carried:
        src = shipped_file(tree, carried[0])
        _expect(src.is_relative_to(park.park_dir(tree)) and park.sha256_file(src) == entries[f"{park.SCOPE}/"
                f"{carried[0]}"]["sha256"], "a shipped file is read from .gpu-park/", src)
    seen.update(tree_mib=round(before / MIB, 2), parked_tree_mib=round(after / MIB, 2),
                parked_files=len(loose), part_mib=round(plan["part_bytes"] / MIB, 2))
    return res


def _unpark_half(tree: Path, parked: dict) -> None:
    first = parked["moved"][0]
    (tree / first).write_bytes(b"not the parked file")
    try:
        park.unpark(tree)
        raise SelfTestError("unpark overwrote a different file")
    except park.ParkError as exc:
        _expect("refusing to overwrite" in str(exc), "unpark refuses to overwrite", exc)
    (tree / first).unlink()
    res = park.unpark(tree)
    _expect(sorted(res["restored"]) == sorted(parked["moved"]) and res["bytes"] == parked["bytes"],
            "unpark restores every file", res)
    _expect(_git_status(tree) == "" and park.guard(tree) is None and not park.park_dir(tree).exists(),
            "the copy is whole again", _git_status(tree))
    _expect(park.unpark(tree) == {"restored": [], "already": [], "bytes": 0}, "unparking again does nothing", None)


def _shipped_tensors(model: Path, l: int, g: int) -> dict:
    import torch
    from safetensors.torch import load_file

    from modelkit.swiftkv import init_swiftkv_tensors

    base = load_file(str(model / "model.safetensors"))
    gen = torch.Generator().manual_seed(g)
    init = init_swiftkv_tensors(base.__getitem__, TINY["num_hidden_layers"], l, g)
    return {k: (v + 0.01 * torch.randn(v.shape, generator=gen)).to(torch.bfloat16).contiguous() for k, v in init.items()}


def _pack(base: Path, wheels: list[Path]) -> dict:
    import torch
    from safetensors.torch import save_file

    model = write_random_llama(base / "tiny-llama", TINY, seed=0, std=0.3)
    g = torch.Generator().manual_seed(0)
    arrays = {"train": torch.randint(3, TINY["vocab_size"], (16, 32), generator=g).numpy(),
              "heldout": torch.randint(3, TINY["vocab_size"], (2, 32), generator=g).numpy()}
    files = {w.name: w for w in wheels}
    files.update(payloads.save_windows(arrays, base / "staging"))
    shipped = {}
    for grp in (1, 2):
        rel = f"{SHIPPED_REL}/swiftkv-l2-g{grp}.safetensors"
        path = base / "staging" / f"swiftkv-l2-g{grp}.safetensors"
        save_file(_shipped_tensors(model, 2, grp), str(path))
        files[f"shipped.{rel.replace('/', '~')}"], shipped[f"shipped.{rel.replace('/', '~')}"] = path, rel
    files["tiny-llama.tar"] = payloads.tar_model(model, base / "staging" / "tiny-llama.tar")
    meta = {"windows": {"seq_len": 32, "chat_repeats": 2, "seed": 0}, "model_file": "tiny-llama.tar",
            "model_name": "tiny-llama", "shipped": {"files": shipped, "base": "tiny-llama"}}
    part = max(256 << 10, sum(w.stat().st_size for w in wheels) + (320 << 10))   # the wheels fit part1
    return build_pack(base / "pack-built", files, part, meta)


def _stages(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())["stages"]


def _session(base: Path, tree: Path, python: str, wheels: list[Path], seen: dict) -> None:
    from safetensors.torch import load_file

    from refengine.swiftkv_format import tensor_names as swiftkv_tensor_names

    manifest = _pack(base, wheels)
    spans = sorted({c["part"] for c in manifest["files"]["tiny-llama.tar"]["chunks"]})
    _expect(len(spans) >= (2 if wheels else 3) and "part1" in spans, "the tiny model spans several parts", spans)
    device_pack = base / "pack"
    shutil.copytree(base / "pack-built" / "part1", device_pack / "part1")
    cfg = SessionConfig(root=tree, work=base / "work", out=base / "out", pack=device_pack, python=python,
                        device="cpu", budget_s=900, collect_reserve_s=5, bench_args=BENCH.split(), distill_l=2,
                        distill_groups=[1, 2], distill_steps=4, distill_micro_batch=2, distill_eval_every=2,
                        distill_eval_windows=2, distill_save_every=1, distill_init_windows=4,
                        distill_dtype="float32", distill_compile=False, distill_overhead_s=0)
    seen["parts"] = manifest["parts"]

    seen["rc1"] = run_check(cfg)
    s = _stages(cfg.out)
    _expect(seen["rc1"] == 0 and s["env"]["status"] == "done", "call 1 runs clean", s["env"])
    if wheels:
        _expect(bool(s["env"].get("installed_wheels")) or not s["env"].get("missing_before"),
                "call 1 installs the carried wheels where modules are missing", s["env"])
    seen["env"] = {k: s["env"].get(k) for k in ("python", "torch", "missing_before", "installed_wheels")}
    _expect(s["model"]["status"] == "waiting" and s["distill"]["status"] == "waiting", "call 1 waits for parts",
            (s["model"], s["distill"]))
    _expect(s["model"].get("shipped") == [f"{SHIPPED_REL}/swiftkv-l2-g{g}.safetensors" for g in (1, 2)],
            "call 1 places the shipped tensors of part1", s["model"])
    _expect(s["tests"]["status"] == "waiting" and s["bench"]["status"] == "done",
            "call 1 runs the bench; the tests wait for the model", (s["tests"], s["bench"]))
    _expect(s["vllm"]["status"] == "skipped" and s["vllm-tests"]["status"] == "skipped",
            "without vLLM in the pack its stages are skipped, not failed", (s["vllm"], s["vllm-tests"]))
    _expect(s["bench"]["result"]["swiftkv_prefill_ratio"] > 0, "the benchmark measured", s["bench"])

    for part in sorted((base / "pack-built").glob("part*"))[1:]:
        shutil.copytree(part, device_pack / part.name)
    seen["rc2"] = run_check(replace(cfg, distill_max_s=1e-6))
    s = _stages(cfg.out)
    _expect(s["model"]["status"] == "done", "call 2 joins the model", s["model"])
    _expect(s["tests"]["status"] == "done" and s["tests"]["fingerprint"] == "model",
            "call 2 runs the tests with the model", s["tests"])
    d = s["distill"]
    _expect(d["status"] == "partial" and d["steps"] == 1, "call 2 stops after one step", d)
    shipped_dir = Path(cfg.work) / "checkpoints" / SHIPPED_REL
    _expect(d["init"] == str(shipped_dir), "the distillation starts from the carried shipped tensors", d)
    for g in (1, 2):
        start = load_file(str(Path(cfg.work) / "distill" / f"init-l2-g{g}.safetensors"))
        carried = load_file(str(shipped_dir / f"swiftkv-l2-g{g}.safetensors"))
        _expect(start.keys() == carried.keys() and all(start[k].equal(carried[k]) for k in carried),
                f"g={g} starts from exactly the carried tensors", sorted(start))

    seen["rc3"] = run_check(cfg)
    s = _stages(cfg.out)
    d = s["distill"]
    _expect(seen["rc3"] == 0 and d["status"] == "done" and d["steps_before"] == 1 and d["steps"] == 4,
            "call 3 resumes and finishes", d)
    for g in (1, 2):
        names = set(load_file(str(cfg.out / f"swiftkv-l2-g{g}.safetensors")))
        _expect(names == set(swiftkv_tensor_names(TINY["num_hidden_layers"], 2, g)), f"g={g} tensors", names)
    problems = out_problems(cfg.out)
    _expect(not problems, "the output folder comes back whole", problems)
    seen["out"] = sorted(f.name for f in cfg.out.iterdir())
    seen["stages"] = {k: v["status"] for k, v in s.items()}


STUB_VLLM = {
    "vllm/__init__.py": "__version__ = '0.26.0'\n\n\nclass ModelRegistry:\n    @staticmethod\n"
                        "    def get_supported_archs():\n        return []\n",
    "vllm/plugins/__init__.py": "from importlib.metadata import entry_points\n\n\ndef load_general_plugins():\n"
                                "    for ep in entry_points(group='vllm.general_plugins'):\n"
                                "        ep.load()          # a stub: found and imported, never called\n",
    "vllm-0.26.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: vllm\nVersion: 0.26.0\n",
}
STUB_DEP = "swiftserve-selftest-dep"


def _wheel(dest: Path, name: str, version: str) -> Path:
    """A pure-Python wheel of one empty module (what a carried override looks like)."""
    import zipfile

    mod = name.replace("-", "_")
    whl = dest / f"{mod}-{version}-py3-none-any.whl"
    dest.mkdir(parents=True, exist_ok=True)
    info = f"{mod}-{version}.dist-info"
    files = {f"{mod}/__init__.py": "", f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: selftest\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    with zipfile.ZipFile(whl, "w") as z:
        for n, text in files.items():
            z.writestr(n, text)
        z.writestr(f"{info}/RECORD", "".join(f"{n},,\n" for n in files) + f"{info}/RECORD,,\n")
    return whl


def _vllm_stage(base: Path, tree: Path, python: str, seen: dict) -> None:
    from gpubundle import stages, vllm_pack, vllm_stages

    site = base / "stub-site"
    for rel, text in {**STUB_VLLM, "vllm/pad.bin": None}.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        if text is None:
            (site / rel).write_bytes(os.urandom(200_000))       # archive 1 (this alone) outweighs archive 2
        else:
            (site / rel).write_text(text)
    arch = vllm_pack.write_archives(site, base / "stub-out", 2, level=1)
    dep = _wheel(base / "stub-out", STUB_DEP, "2.0")
    checks = [{"name": "pytest", "specifier": ">=1", "by": ["vllm"]},
              {"name": STUB_DEP, "specifier": ">=2", "by": ["vllm"]}]
    meta = {"vllm": {"version": "0.26.0", "digest": "stub", "archives": arch, "checks": checks,
                     "overrides": [{"name": STUB_DEP, "version": "2.0", "wheel": dep.name}]}}
    # carry order: the wheel and the small archive 2 fill part1, the large archive 1 spans part1 and part2
    files = {dep.name: dep, **{a["name"]: base / "stub-out" / a["name"] for a in reversed(arch)}}
    build_pack(base / "stub-pack-built", files, max(f.stat().st_size for f in files.values()) + (64 << 10), meta)
    pack = base / "stub-pack"
    shutil.copytree(base / "stub-pack-built" / "part1", pack / "part1")
    cfg = SessionConfig(root=tree, work=base / "stub-work", pack=pack, python=python, device="cpu").resolved()
    ctx = stages.Context(cfg, {"env": {"status": "done"}}, env={**os.environ, "PYTHONPATH": str(tree)})
    first = vllm_stages.stage_vllm(ctx, 60)
    _expect(first["status"] == "waiting" and first["unpacked_now"] == [arch[1]["name"]],
            "with part1 the stub's complete archive is unpacked and the stage waits for part2", first)
    for part in sorted((base / "stub-pack-built").glob("part*"))[1:]:
        shutil.copytree(part, pack / part.name)
    rec = vllm_stages.stage_vllm(ctx, 60)
    _expect(rec["unpacked_now"] == [arch[0]["name"]] and rec["overrides_installed"] == [dep.name],
            "then the other archive, and the carried wheel of the failing check only", rec)
    _expect(all(c["ok"] for c in rec["checks"].values()) and rec["checks"][STUB_DEP]["image"] is None,
            "every check passes after the override", rec["checks"])
    imp = rec.get("import", {})
    _expect(imp.get("plugins", {}).get("swiftserve") == "swiftserve_vllm:register"
            and Path(imp["vllm_file"]).is_relative_to(cfg.work / "vllm" / "site"),
            "import vllm comes from the unpacked site and finds the plugin's entry point", imp)
    _expect(rec["status"] == "failed" and "did not register" in rec.get("error", ""),
            "a vLLM that registers none of the plugin's classes fails the stage", rec)
    seen["vllm_stub"] = {k: rec.get(k) for k in ("status", "error", "overrides_installed")}


def run_selftest(base: Path, root: Path = ROOT, python: str = sys.executable, wheels: list[Path] = ()) -> dict:
    """All of it in ``base``; ``python`` runs the stages; ``wheels`` are carried in the pack's first part."""
    seen: dict = {}
    if park.guard(root):
        raise SelfTestError(f"{root}: {park.guard(root)}")
    tree = copy_tree(root, base / "tree")
    parked = _park_half(root, tree, seen)
    _session(base, tree, python, list(wheels), seen)
    _vllm_stage(base, tree, python, seen)
    _unpark_half(tree, parked)
    return seen


def packed_wheels(pack: Path, dest: Path) -> list[Path]:
    """The complete wheels of a ``make gpu-pack`` pack, joined (sha256-checked) into ``dest``."""
    got = assemble(pack, dest)
    return sorted(p for n, p in got.files.items() if n.endswith(".whl"))


def main(args) -> int:
    def run(base: Path) -> dict:
        wheels = packed_wheels(Path(args.wheels_from_pack), base / "wheels") if args.wheels_from_pack else []
        if args.wheels_from_pack and not wheels:
            raise SelfTestError(f"no complete wheels in {args.wheels_from_pack}")
        return run_selftest(base, python=args.python or sys.executable, wheels=wheels)

    if args.dir:
        base = Path(args.dir)
        shutil.rmtree(base, ignore_errors=True)
        base.mkdir(parents=True)
        seen = run(base)
    else:
        with tempfile.TemporaryDirectory(prefix="gpu-check-selftest-") as tmp:
            seen = run(Path(tmp))
    print(json.dumps(seen, indent=1))
    print("gpu-check self-test: parking, every stage and resuming ran as expected")
    return 0
