"""The output folder of ``gpu-check``: everything a GPU session brings back, within the limits.

Files (rewritten by every call, so the latest call's folder is complete on its own):
- ``results.json``: the configuration, every stage's record (test counts, the benchmark's
  JSON, distillation steps, tokens/s and held-out KL from its log) and the size check;
- ``summary.md``: the same for a reader, with what to do next;
- ``logs.tar.gz``: the stages' logs, the distillation's ``train_log.jsonl`` / ``run.json`` /
  ``init.json``, the tests' junit XML, the benchmark's JSON and the pack manifest;
- ``swiftkv-l{l}-g{g}.safetensors`` per trained group size: the distilled SwiftKV tensors
  only (``q/k/v_proj_swiftkv``, ``norm_swiftkv``; bf16), from the finished run's export or,
  mid-run, from the last ``state.pt`` (metadata ``step``). A random-weights run brings none.
  ``modelkit distill --init <folder>`` or ``modelkit convert-swiftkv`` take them up again;
- ``summary.json``: the summary keys of ``results/gpu/summary.json`` that the vLLM stages measured
  on CUDA (``vllm_stages.gpu_summary``; absent when none did): ``python -m gpubundle
  merge-summary <this folder>`` merges them here.
``out_problems`` then checks the folder against the limits; a folder that would not come
back whole is reported in both files and makes the call exit non-zero.
"""

from __future__ import annotations

import json
import statistics
import tarfile
from pathlib import Path

from gpubundle.limits import MIB, Limits, out_problems
from gpubundle.vllm_stages import gpu_summary

OWN = ("results.json", "summary.md", "logs.tar.gz", "summary.json")


def distill_figures(run_dir: Path) -> dict:
    """Steps, tokens, median tokens/s and held-out KL history from ``train_log.jsonl``."""
    log = run_dir / "train_log.jsonl"
    if not log.is_file():
        return {}
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    if not rows:
        return {}
    per_step = rows[-1]["tokens"] / rows[-1]["step"]
    rates = [per_step / r["sec"] for r in rows[1:] if r["sec"] > 0]   # the first step compiles
    keys = sorted({k for r in rows for k in r if k.startswith("heldout_kl")})
    return {"steps": rows[-1]["step"], "tokens": rows[-1]["tokens"],
            "tokens_per_s_median": round(statistics.median(rates), 1) if rates else None, "last": rows[-1],
            "heldout_kl": {k: [[r["step"], r[k]] for r in rows if k in r] for k in keys}}


def export_tensors(run_dir: Path, l: int, groups: list[int], out: Path) -> list[Path]:
    """The run's SwiftKV tensors into ``out`` (exported files if the run finished, else from state.pt)."""
    from modelkit.distill_train import tensor_file

    done = (run_dir / "run.json").is_file()
    if done and all(tensor_file(run_dir, l, g).is_file() for g in groups):
        paths = []
        for g in groups:
            dst = out / tensor_file(run_dir, l, g).name
            dst.write_bytes(tensor_file(run_dir, l, g).read_bytes())
            paths.append(dst)
        return paths
    state = run_dir / "state.pt"
    if not state.is_file():
        return []
    import torch
    from safetensors.torch import save_file

    st = torch.load(state, map_location="cpu", weights_only=False)
    paths = []
    for g, tensors in st["students"].items():
        dst = out / tensor_file(run_dir, l, g).name
        save_file({k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()}, str(dst),
                  metadata={"format": "pt", "l": str(l), "g": str(g), "step": str(st["step"])})
        paths.append(dst)
    return paths


def _logs(work: Path, pack_manifest: Path | None, dest: Path) -> None:
    run_dir = work / "distill"
    extra = [work / "tests.xml", work / "bench.json", work / "state.json", pack_manifest] + \
            [run_dir / n for n in ("train_log.jsonl", "run.json", "init.json")] + \
            [work / n for n in ("vllm-tests.xml", "vllm-results.json")] + \
            sorted((work / "vllm-8b").glob("*.json")) + sorted((work / "vllm-8b").glob("server-*.log")) + \
            [f for f in sorted((work / "vllm-probes").glob("*")) if f.suffix in (".log", ".json")]
    with tarfile.open(dest, "w:gz") as t:
        for f in sorted((work / "logs").glob("*.log")) + [f for f in extra if f and f.is_file()]:
            sub = "vllm-probes/" if f.parent.name == "vllm-probes" else ""
            t.add(f, arcname=f"gpu-check/{sub}{f.name}")


def summary_md(res: dict) -> str:
    lines = ["# GPU session (`make gpu-check`)", "",
             f"Device: {res['env'].get('device')} (torch {res['env'].get('torch')}, "
             f"CUDA {'yes' if res['env'].get('cuda') else 'no'}, {res['env'].get('gpus', 0)} GPU(s)); "
             f"call {res['call']} used {res['seconds']:.0f} s of a {res['budget_s']:.0f} s budget.", "",
             "| stage | status | seconds | notes |", "|---|---|---:|---|"]
    for name, r in res["stages"].items():
        note = (r.get("reason") or r.get("error") or "").strip().splitlines()[-1:]    # a traceback's last line
        note = note[0].replace("|", "/") if note else ""
        if name in ("tests", "vllm-tests") and "tests" in r:
            note = f"{r['passed']} passed, {r['failures'] + r['errors']} failed, {r['skipped']} skipped"
        if name == "vllm" and r.get("import"):
            note = f"vllm {r['import']['vllm']}, plugin registered" + (f"; unmet: {'; '.join(r['unmet'])}"
                                                                      if r.get("unmet") else "")
        if name == "vllm-8b" and r.get("result", {}).get("ratios"):
            note = "SwiftKV / stock: " + ", ".join(f"{k} {v}" for k, v in r["result"]["ratios"].items()) + \
                (f"; {note}" if note else "")
        if name == "distill" and "steps" in r:
            start = f", from {Path(r['init']).name}" if r.get("init") else ""
            note = f"{r['kind']} model{start}, step {r['steps']} of {r['target_steps']}" + (f"; {note}" if note else "")
        lines.append(f"| {name} | {r['status']} | {r.get('seconds', 0):.0f} | {note} |")
    bench = res["stages"].get("bench", {}).get("result")
    if bench:
        lines += ["", "Benchmark: " + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                                                for k, v in bench.items())]
    d = res.get("distill") or {}
    if d:
        lines += ["", f"Distillation: {d['tokens']} tokens in {d['steps']} steps, median {d['tokens_per_s_median']} "
                      f"tokens/s; held-out KL {json.dumps(d['heldout_kl'])}"]
    if res.get("summary"):
        lines += ["", "Summary keys (merge with `python -m gpubundle merge-summary DIR`): " +
                  json.dumps(res["summary"])]
    lines += ["", "Files: " + ", ".join(f"{f['name']} ({f['bytes'] / MIB:.2f} MiB)" for f in res["files"])]
    if res["problems"]:
        lines += ["", "**Output folder over the limits:** " + "; ".join(res["problems"])]
    if any(r["status"] in ("partial", "waiting", "timeout") for r in res["stages"].values()):
        lines += ["", "Not finished: run the same command again (with the next pack part, if one is waiting); "
                      "done stages are skipped and the distillation resumes from its checkpoint."]
    return "\n".join(lines) + "\n"


def collect(cfg, state: dict, env: dict, call: int, seconds: float, limits: Limits = Limits()) -> dict:
    out, work = Path(cfg.out), Path(cfg.work)
    out.mkdir(parents=True, exist_ok=True)
    for f in list(out.glob("swiftkv-*.safetensors")) + [out / n for n in OWN]:
        f.unlink(missing_ok=True)
    distill = state.get("distill", {})
    if distill.get("kind") in ("pack", "dir"):
        export_tensors(work / "distill", cfg.distill_l, cfg.distill_groups, out)
    manifests = sorted(Path(cfg.pack).glob("part*/manifest.json"))
    _logs(work, manifests[0] if manifests else None, out / "logs.tar.gz")
    gpu = gpu_summary(state, work)
    if gpu:
        (out / "summary.json").write_text(json.dumps({"device": env.get("device"), "keys": gpu}, indent=1) + "\n")
    res = {"call": call, "seconds": round(seconds, 1), "budget_s": cfg.budget_s, "env": env, "stages": state,
           "summary": gpu,
           "distill": distill_figures(work / "distill"), "config": {k: str(v) if isinstance(v, Path) else v
                                                                     for k, v in vars(cfg).items()}}
    for _ in range(2):                 # the second pass counts results.json and summary.md themselves
        res["files"] = [{"name": f.name, "bytes": f.stat().st_size} for f in sorted(out.iterdir()) if f.is_file()]
        res["problems"] = out_problems(out, limits)
        (out / "results.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
        (out / "summary.md").write_text(summary_md(res))
    return res
