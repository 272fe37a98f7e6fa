"""The vLLM stages of ``gpu-check`` (after the reference engine's; see ``registry``).

- ``vllm``: the pack's vLLM made ready (``vllm_env``): each carried archive unpacked into
  ``<work>/vllm/site`` as soon as its parts have arrived (``waiting`` until all have); then the
  image's packages checked against what the carried ones need (the answer ``pip show`` would
  give), a carried replacement installed into ``<work>/vllm/overrides`` for each that fails, the
  plugin's entry point declared in ``<work>/vllm/plugin``, and ``import vllm`` with the plugin
  registered, in a subprocess, as vLLM's processes will. Its record keeps the paths.
- ``vllm-tests``: ``pytest tests/gpu -m vllm`` with that vLLM, its independent groups at once
  (``-n 7 --dist loadgroup`` where the image has pytest-xdist: seven small engines share the GPU,
  and their start-ups, mostly compilation on the CPU, overlap); each probe run is recorded in
  ``<work>/vllm-results.json`` (``vllm_results``), from which ``collect`` derives the summary keys.
- ``vllm-8b``: ``python -m benchmarks serve vllm_gpu_8b`` (SwiftKV against stock vLLM at a Llama-3.1-8B shape);
  its ``vllm_8b.json`` is the record's ``result``.
A stage that needs vLLM waits while ``vllm`` is not done; the test stages wait for the model too.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from gpubundle import image, vllm_env
from gpubundle.pack import PackError, assemble
from gpubundle.stages import Context, junit_counts
from gpubundle.vllm_results import RESULTS_ENV


def vllm_dir(ctx: Context) -> Path:
    return ctx.work / "vllm"


def environ(ctx: Context) -> dict:
    """The subprocess environment of the vLLM stages (the ``vllm`` stage's paths first)."""
    paths = ctx.state.get("vllm", {}).get("paths", [])
    return {**vllm_env.vllm_environ(ctx.env, paths), RESULTS_ENV: str(ctx.work / "vllm-results.json")}


def stage_vllm(ctx: Context, timeout: float) -> dict:
    try:
        got = assemble(ctx.cfg.pack, ctx.work / "pack")
    except PackError as exc:
        return {"status": "failed", "error": str(exc)}
    meta = got.meta.get("vllm")
    if not meta:
        return {"status": "skipped", "reason": "the pack carries no vLLM (make gpu-pack; GPU_VLLM_VERSION=none "
                                               "leaves it out)"}
    d = vllm_dir(ctx)
    site, over, plugin = d / "site", d / "overrides", d / "plugin"
    ready = {a["name"]: got.files[a["name"]] for a in meta["archives"] if a["name"] in got.files}
    rec: dict = {"version": meta["version"], "archives": len(meta["archives"]), "fingerprint": meta["digest"],
                 "unpacked_now": vllm_env.unpack(ready, site)}
    waiting = sorted({p for a in meta["archives"] for p in got.missing.get(a["name"], [])})
    if waiting:
        return {**rec, "status": "waiting", "reason": f"vLLM's archives need parts {', '.join(waiting)}"}
    python = ctx.cfg.python
    checks = vllm_env.check_requirements(python, meta["checks"], env=ctx.env)
    wheels = {o["name"]: got.files[o["wheel"]] for o in meta["overrides"] if o["wheel"] in got.files}
    rec["overrides_installed"] = vllm_env.install_overrides(python, checks, wheels, over)
    vllm_env.write_plugin_dist(Path(ctx.cfg.root), plugin)
    rec["paths"] = [str(over), str(site), str(plugin)]
    env = vllm_env.vllm_environ(ctx.env, rec["paths"])
    after = vllm_env.check_requirements(python, meta["checks"], env=env)
    rec["checks"] = {c["name"]: {"needs": c["specifier"], "image": b["installed"], "now": c["installed"], "ok": c["ok"]}
                     for c, b in zip(after, checks)}
    # what still fails: the image's own torch stack, numpy and numba by design (image.NEVER_CARRY), the rest
    # (a replacement not carried: too large, e.g. cuda-bindings of the CUTLASS DSL) reported
    for key, keep in (("unmet", False), ("unmet_by_design", True)):
        rec[key] = [f"{c['name']} {c['installed']} (needs {c['specifier']}, by {', '.join(c['by'])})"
                    for c in after if not c["ok"] and (c["name"] in image.NEVER_CARRY) == keep]
    try:
        rec["import"] = vllm_env.import_check(python, env, Path(ctx.cfg.root))
    except RuntimeError as exc:
        return {**rec, "status": "failed", "error": str(exc)}
    from swiftserve_vllm import ARCHITECTURES

    missing = [a for a in ARCHITECTURES if a not in rec["import"]["registered"]]
    if missing:
        return {**rec, "status": "failed", "error": f"the plugin did not register {missing}"}
    if ctx.cfg.device.startswith("cuda") and not rec["import"]["cuda"]:
        return {**rec, "status": "failed", "error": "torch sees no CUDA device with vLLM on the path"}
    return {**rec, "status": "done"}


def _needs(ctx: Context, model: bool) -> dict | None:
    """A waiting/skipped record while vLLM (and, if asked, the model) is not there; None when it is."""
    later = (None, "waiting", "deferred", "timeout", "partial")       # it may still come in a later call
    v = ctx.state.get("vllm", {})
    if v.get("status") != "done":
        return {"status": "waiting" if v.get("status") in later else "skipped",
                "reason": f"vLLM is not ready ({v.get('status', 'not run')}: {v.get('reason') or v.get('error', '')})"}
    m = ctx.state.get("model", {})
    if model and not m.get("model_dir"):
        return {"status": "waiting" if m.get("status") in later else "skipped",
                "reason": f"the model is not there ({m.get('status', 'not run')})"}
    return None


PARALLEL = 7                     # tests/gpu/test_vllm_gpu.py's xdist groups on one GPU (tp: 2 GPUs)


def _has_xdist(python: str, env: dict) -> bool:
    code = "import importlib.util, sys; sys.exit(importlib.util.find_spec('xdist') is None)"
    return subprocess.run([python, "-c", code], env=env, capture_output=True).returncode == 0


def stage_vllm_tests(ctx: Context, timeout: float) -> dict:
    wait = _needs(ctx, model=True)
    if wait:
        return wait
    name, env = "vllm-tests", environ(ctx)
    xml = ctx.work / f"{name}.xml"
    xml.unlink(missing_ok=True)
    par = ["-n", str(PARALLEL), "--dist", "loadgroup"] if _has_xdist(ctx.cfg.python, env) else []
    cmd = [ctx.cfg.python, "-m", "pytest", "tests/gpu", "-m", "vllm", *par, "-p", "no:cacheprovider",
           "-o", "addopts=-ra", f"--junitxml={xml}"]
    rc = ctx.run(name, cmd, timeout, env=env)
    rec = {"fingerprint": ctx.state["vllm"]["fingerprint"]}
    if rc is None:
        return {**rec, "status": "timeout"}
    counts = junit_counts(xml) if xml.is_file() else {}
    return {**rec, **counts, "parallel": bool(par), "status": "done" if rc == 0 and counts.get("passed") else "failed",
            "rc": rc}


def stage_vllm_8b(ctx: Context, timeout: float) -> dict:
    wait = _needs(ctx, model=False)
    if wait:
        return wait
    out = ctx.work / "vllm-8b"
    args = list(ctx.cfg.vllm_8b_args)
    cmd = [ctx.cfg.python, "-m", "benchmarks", "serve", "vllm_gpu_8b", "--out", str(out), *args]
    rc = ctx.run("vllm-8b", cmd, timeout, env=environ(ctx))
    path = out / "vllm_8b.json"
    rec = {"fingerprint": ctx.state["vllm"]["fingerprint"] + " " + " ".join(args)}
    if path.is_file():
        rec["result"] = json.loads(path.read_text())
    if rc is None:
        return {**rec, "status": "timeout"}
    ok = rc == 0 and all(v is not None for v in rec.get("result", {}).get("ratios", {None: None}).values())
    return {**rec, "status": "done" if ok else "failed", "rc": rc}


def gpu_summary(state: dict, work: Path) -> dict:
    """The issues' summary keys that this session's vLLM stages (and the reference engine's benchmark, its
    decode step against the bandwidth limit when it ran from CUDA graphs) measured on CUDA (none from a CPU run)."""
    from gpubundle import vllm_results

    if not state.get("env", {}).get("cuda"):
        return {}
    out: dict = {}
    v = state.get("vllm", {})
    if v.get("status") == "done":
        out["vllm_gpu_version"] = v["import"]["vllm"]
    results = work / "vllm-results.json"
    if results.is_file():
        out.update(vllm_results.summary(json.loads(results.read_text())))
    r = state.get("vllm-8b", {}).get("result", {}).get("ratios", {})
    for key, name in (("prefill_throughput", "vllm_swiftkv_prefill_throughput_ratio_8b"),
                      ("ttft_mean", "vllm_swiftkv_ttft_ratio_8b"),
                      ("decode_tpot", "vllm_swiftkv_decode_tpot_ratio_8b")):
        if r.get(key) is not None:
            out[name] = r[key]
    if r and out.get("vllm_gpu_runs") is None and state.get("vllm-8b", {}).get("status") == "done":
        out["vllm_gpu_runs"] = True          # the plugin served the SwiftKV 8B shape on CUDA
    b = state.get("bench", {}).get("result", {})  # the reference engine's decode step (issue 46), from CUDA graphs
    for batch in (1, 64):
        if b.get("cuda_graphs") and b.get(f"decode_vs_limit_b{batch}") is not None:
            out[f"ref_decode_step_vs_bandwidth_limit_b{batch}"] = round(b[f"decode_vs_limit_b{batch}"], 3)
    if b.get("decode_ms_by_method") and (b.get("methods_batch"), b.get("context")) == (64, 1024):   # the setting
        out["ref_decode_ms_by_method"] = {k: round(v, 3) for k, v in b["decode_ms_by_method"].items()}
    return out
