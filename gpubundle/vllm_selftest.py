"""``make gpu-vllm-selftest``: the GPU session's vLLM path played here with the image-shaped venv
(``make gpu-image-venv``), everything but the GPU itself. A developer's check, not the suite's:
it builds (or reuses) the payload ``make gpu-pack`` carries, several hundred MB.

1. the payload (``vllm_pack.build_vllm_payload``) split into parts of the size this tree leaves
   under the carry limit (``plan.plan_parts``, the tree as parked), joined back and verified
   (``pack.assemble``): each part plus the parked tree within the limit;
2. the archives unpacked (``vllm_env.unpack``; a second call unpacks nothing), the image's
   packages checked with the image-shaped venv's Python and failing ones replaced from the
   carried wheels, the plugin's dist-info written;
3. ``import vllm`` with the plugin registered through that dist-info (``vllm_env.import_check``),
   and every model class built on the meta device (``swiftserve_vllm.devcheck --platform cpu``:
   the shipped SwiftKV g=1/g=2 and ``testmodels``' ZACK uniform / layer-wise, TP cuts, Qwen2/3),
   each choosing vLLM's V1 runner for the plugin;
4. ``tests/gpu`` collected by that Python with that vLLM (skipped at run time: no CUDA), and the
   8B driver's model folders and word-level tokenizer loaded by vLLM's tokenizer loader.
Prints a JSON report; any failed expectation raises ``SelfTestError``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpubundle import vllm_env
from gpubundle.limits import MIB, Limits, tree_bytes
from gpubundle.pack import assemble, build_pack
from gpubundle.park import parkable
from gpubundle.selftest import SelfTestError, _expect
from gpubundle.vllm_pack import payload_for_args

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER_CHECK = """
import json, sys
from vllm.tokenizers import get_tokenizer
tok = get_tokenizer(sys.argv[1])
ids = tok.encode("t5 t77 t128255", add_special_tokens=False)
print(json.dumps({"ids": ids, "text": tok.decode(ids), "vocab": tok.vocab_size}))
"""


def _parts_fit(payload, base: Path, carry_mib: float, margin_mib: float) -> dict:
    """Pack the payload in parts sized for this tree as parked; join them back; sizes."""
    parked_tree = tree_bytes(ROOT) - sum((ROOT / n).stat().st_size for n in parkable(ROOT))
    part = int(carry_mib * MIB) - parked_tree - int(margin_mib * MIB)
    manifest = build_pack(base / "pack", payload.files, part, {"vllm": payload.meta})
    sizes = {p.name: sum(f.stat().st_size for f in p.iterdir()) for p in sorted((base / "pack").glob("part*"))}
    worst = max(sizes.values()) + parked_tree
    _expect(worst <= Limits.carry_mib * MIB, "every part beside the parked tree fits the carry limit",
            (worst / MIB, sizes))
    got = assemble(base / "pack", base / "joined")
    _expect(not got.missing and set(got.files) == set(payload.files), "the parts join back whole", got.missing)
    return {"parked_tree_mib": round(parked_tree / MIB, 1), "part_mib": round(part / MIB, 1),
            "parts": manifest["parts"], "payload_mib": round(sum(s for s in sizes.values()) / MIB, 1),
            "largest_carry_mib": round(worst / MIB, 1), "files": got.files}


def run(py: str, payload, base: Path) -> dict:
    seen: dict = {"vllm": payload.meta["version"], "archives": payload.meta["archives"],
                  "overrides": payload.meta["overrides"], "unmet": payload.meta["unmet"]}
    fit = _parts_fit(payload, base, Limits.carry_mib, 4.0)
    files = fit.pop("files")
    seen["pack"] = fit
    site, over, plugin = base / "vllm" / "site", base / "vllm" / "overrides", base / "vllm" / "plugin"
    archives = {a["name"]: files[a["name"]] for a in payload.meta["archives"]}
    t0 = time.monotonic()
    _expect(sorted(vllm_env.unpack(archives, site)) == sorted(archives), "every archive unpacks", site)
    seen["unpack_s"] = round(time.monotonic() - t0, 1)
    _expect(vllm_env.unpack(archives, site) == [], "a second unpack does nothing", site)
    base_env = {**os.environ, "PYTHONPATH": str(ROOT)}
    checks = vllm_env.check_requirements(py, payload.meta["checks"], env=base_env)
    wheels = {o["name"]: files[o["wheel"]] for o in payload.meta["overrides"]}
    seen["overrides_installed"] = vllm_env.install_overrides(py, checks, wheels, over)
    seen["image_checks_failing"] = [f"{c['name']} {c['installed']} (needs {c['specifier']})" for c in checks
                                    if not c["ok"]]
    vllm_env.write_plugin_dist(ROOT, plugin)
    env = vllm_env.vllm_environ(base_env, [str(over), str(site), str(plugin)])
    after = vllm_env.check_requirements(py, payload.meta["checks"], env=env)
    seen["checks_failing_after_overrides"] = [f"{c['name']} {c['installed']} (needs {c['specifier']})"
                                              for c in after if not c["ok"]]
    info = vllm_env.import_check(py, env, ROOT)
    from swiftserve_vllm import ARCHITECTURES

    _expect(info["registered"] == list(ARCHITECTURES) and Path(info["vllm_file"]).is_relative_to(site),
            "vLLM imports from the unpacked site and the plugin registers through the written dist-info", info)
    seen["import"] = info
    seen["devcheck"] = _devcheck(py, env, base)
    col = subprocess.run([py, "-m", "pytest", "tests/gpu", "--collect-only", "-q", "-p", "no:cacheprovider"],
                         cwd=ROOT, env=env, capture_output=True, text=True)
    _expect(col.returncode == 0 and "collected" in col.stdout,
            "tests/gpu collects with the image's Python and the carried vLLM", (col.stdout + col.stderr)[-2000:])
    seen["tests_gpu_collected"] = col.stdout.strip().splitlines()[-1]
    seen["tokenizer"] = _tokenizer(py, env, base)
    return seen


def _devcheck(py: str, env: dict, base: Path) -> list[dict]:
    from swiftserve_vllm.testmodels import make_test_models

    made = make_test_models(base / "models")
    models = ["SmolLM2-135M-Instruct-SwiftKV", "SmolLM2-135M-Instruct-SwiftKV-AcrossKV2",
              *(str(made[n]) for n in ("zack-r32", "tp-g2", "tp-zack", "tp-zack-lw", "qwen2-swiftkv", "qwen3-swiftkv"))]
    out = base / "devcheck.json"
    cmd = [py, "-m", "swiftserve_vllm.devcheck", "--platform", "cpu", "--out", str(out),
           *sum((["--model", m] for m in models), [])]
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    got = json.loads(out.read_text()) if out.is_file() else []
    _expect(res.returncode == 0 and len(got) == len(models) and all(r["stray"] == [] for r in got),
            "every model class builds on the meta device with nothing left behind", res.stderr[-3000:])
    _expect(all(r["v1_runner_for_plugin"] is True for r in got), "vLLM is steered to its V1 runner for each", got)
    return [{"model": Path(r["model"]).name, "tensors": r["tensors"], "shims": r["shims"]} for r in got]


def _tokenizer(py: str, env: dict, base: Path) -> dict:
    code = ("import sys; from benchmarks.serve.vllm_gpu_8b import LLAMA_8B, write_models; "
            "from pathlib import Path; write_models(Path(sys.argv[1]), LLAMA_8B)")
    subprocess.run([py, "-c", code, str(base / "8b")], cwd=ROOT, env=env, check=True)
    res = subprocess.run([py, "-c", TOKENIZER_CHECK, str(base / "8b" / "tokenizer")], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    _expect(res.returncode == 0, "vLLM loads the 8B stage's tokenizer", res.stderr[-2000:])
    got = json.loads(res.stdout.strip().splitlines()[-1])
    _expect(got["ids"] == [5, 77, 128255] and got["text"] == "t5 t77 t128255" and got["vocab"] == 128256,
            "the word-level tokenizer round-trips", got)
    return got


def main(args) -> int:
    payload = payload_for_args(args, ROOT)
    if args.dir:
        base = Path(args.dir)
        shutil.rmtree(base, ignore_errors=True)
        base.mkdir(parents=True)
        seen = run(args.image_python, payload, base)
    else:
        with tempfile.TemporaryDirectory(prefix="gpu-vllm-selftest-") as tmp:
            seen = run(args.image_python, payload, Path(tmp))
    print(json.dumps(seen, indent=1, default=str))
    print(f"gpu vLLM self-test: vllm {payload.meta['version']} packed, unpacked, imported with the plugin and every "
          "model class built, with the image-shaped venv", file=sys.stderr)
    return 0
