"""Quality of the quantized formats against bf16 (issue 50): perplexity through the cache and the task
suite, by ``modelkit eval``, then the summary keys (SmolLM2 only).

    python -m benchmarks quality quant [--model default|gemma-3-270m] [--samples 32] [--task-items 25]
                                       [--work DIR] [--no-summary]

Runs (each against the same float32 baseline, the engine's CPU default; every model is the
embedded SmolLM2, whose safetensors are its Q4_1 GGUF dequantized, so the GGUF's own loss against
the original bf16 release is the floor and is not in these figures):
  * ``modelkit quantize --model default`` (no smoothing, and ``--smooth 0.5``) into ``--work``;
  * one ``modelkit eval`` of: bf16 (``--model-arg bf16:dtype=bfloat16``), the Q4_1 GGUF served natively
    (``load_format=gguf``), the two W8A8 checkpoints; ``results/quant/eval.json`` + ``.md``, and
    ``quality.json`` with the keys.
``q4_ppl_increase_pct`` = 100 (ppl(Q4_1 GGUF) / ppl(bf16) - 1), ``int8_ppl_increase_pct`` the same
for the better W8A8 checkpoint (lower perplexity); both merged into results/perf/summary.json.

``--model gemma-3-270m`` (prepared with ``modelkit prepare --model gemma-3-270m --accept-license``) runs
the same comparison on Gemma 3 270M: its Q4_K_M GGUF served natively, its two W8A8 checkpoints, bf16, all
against its float32 safetensors (the GGUF dequantized, so again the GGUF's own loss is the floor). It
writes ``results/quant/gemma-3-270m/`` and no summary key (the issue's keys are SmolLM2's).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.lib.records import ROOT, merge_json, write_json

OUT = ROOT / "results" / "quant"


def modelkit(*args: str) -> None:
    cmd = [sys.executable, "-m", "modelkit", *args]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default="default", choices=("default", "gemma-3-270m"),
                    help="SmolLM2 (the embedded default) or Gemma 3 270M (opt-in, prepared first)")
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--task-items", type=int, default=25)
    ap.add_argument("--corpus", default=str(Path.home() / ".cache" / "swiftserve" / "corpus" / "smollm2-v2"),
                    help="a `modelkit build-corpus` directory; its held-out split is scored")
    ap.add_argument("--work", default=None, help="where the W8A8 checkpoints go (default: a temporary directory)")
    ap.add_argument("--no-summary", action="store_true")


def main(args: argparse.Namespace) -> int:
    from modelkit.corpus import missing

    if why := missing(Path(args.corpus)):                  # before minutes of quantizing, not after
        sys.exit(f"quant_quality: {why}; or pass --corpus")

    gemma = args.model == "gemma-3-270m"
    name, q4, out = ("gemma", "q4_k_m_gguf", OUT / args.model) if gemma else ("smollm2", "q4_1_gguf", OUT)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp)
        w8, w8s = work / f"{name}-w8a8", work / f"{name}-w8a8-smooth05"
        modelkit("quantize", "--model", args.model, "--output", str(w8), "--quiet")
        modelkit("quantize", "--model", args.model, "--output", str(w8s), "--smooth", "0.5", "--quiet")
        # one run, so the float32 baseline is measured once; each model's own settings by --model-arg
        modelkit("eval", "--corpus", args.corpus, "--baseline", args.model, "--samples", str(args.samples),
                 "--gen-prompts", "0", "--metrics", "ppl,tasks", "--task-items", str(args.task_items),
                 "--model", f"bf16={args.model}", "--model-arg", "bf16:dtype=bfloat16",
                 "--model", f"{q4}={args.model}", "--model-arg", f"{q4}:load_format=gguf",
                 "--model", f"w8a8={w8}", "--model", f"w8a8_smooth05={w8s}", "--out", str(out / "eval.json"))
        res = json.loads((out / "eval.json").read_text())["results"]

    ppl = {k: v["ppl"] for k, v in res.items()}
    best_w8 = min(("w8a8", "w8a8_smooth05"), key=ppl.get)
    keys = {"q4_ppl_increase_pct": 100 * (ppl[q4] / ppl["bf16"] - 1),
            "int8_ppl_increase_pct": 100 * (ppl[best_w8] / ppl["bf16"] - 1)}
    table = {k: {"ppl": v["ppl"], "ppl_float32": v["ppl_baseline"], "ppl_increase_vs_float32_pct": v["ppl_increase_pct"],
                 "task_accuracy": v.get("task_accuracy"), "ppl_increase_vs_bf16_pct": 100 * (v["ppl"] / ppl["bf16"] - 1)}
             for k, v in res.items()}
    doc = {"command": args.command, "model": args.model, "int8_checkpoint_used": best_w8,
           **keys, "models": table}
    print(json.dumps(doc, indent=1))
    write_json(out / "quality.json", doc)
    if not args.no_summary and not gemma:
        merge_json(ROOT / "results" / "perf" / "summary.json", keys)
