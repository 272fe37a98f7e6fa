"""Quality of the quantized formats on SmolLM2 against bf16 (issue 50): perplexity through the cache
and the task suite, by ``modelkit eval``, then the summary keys.

    python -m benchmarks quality quant [--samples 32] [--task-items 25] [--work DIR] [--no-summary]

Runs (each against the same float32 baseline, the engine's CPU default; every model is the
embedded SmolLM2, whose safetensors are its Q4_1 GGUF dequantized, so the GGUF's own loss against
the original bf16 release is the floor and is not in these figures):
  * ``modelkit quantize --model default`` (no smoothing, and ``--smooth 0.5``) into ``--work``;
  * one ``modelkit eval`` of: bf16 (``--model-arg bf16:dtype=bfloat16``), the Q4_1 GGUF served natively
    (``load_format=gguf``), the two W8A8 checkpoints; ``results/quant/eval.json`` + ``.md``, and
    ``quality.json`` with the keys.
``q4_ppl_increase_pct`` = 100 (ppl(Q4_1 GGUF) / ppl(bf16) - 1), ``int8_ppl_increase_pct`` the same
for the better W8A8 checkpoint (lower perplexity); both merged into results/perf/summary.json.
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
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--task-items", type=int, default=25)
    ap.add_argument("--corpus", default=str(Path.home() / ".cache" / "swiftserve" / "corpus" / "smollm2-v2"))
    ap.add_argument("--work", default=None, help="where the W8A8 checkpoints go (default: a temporary directory)")
    ap.add_argument("--no-summary", action="store_true")


def main(args: argparse.Namespace) -> int:
    from modelkit.corpus import missing

    if why := missing(Path(args.corpus)):                  # before minutes of quantizing, not after
        sys.exit(f"quant_quality: {why}; or pass --corpus")

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp)
        w8, w8s = work / "smollm2-w8a8", work / "smollm2-w8a8-smooth05"
        modelkit("quantize", "--model", "default", "--output", str(w8), "--quiet")
        modelkit("quantize", "--model", "default", "--output", str(w8s), "--smooth", "0.5", "--quiet")
        # one run, so the float32 baseline is measured once; each model's own settings by --model-arg
        modelkit("eval", "--corpus", args.corpus, "--baseline", "default", "--samples", str(args.samples),
                 "--gen-prompts", "0", "--metrics", "ppl,tasks", "--task-items", str(args.task_items),
                 "--model", "bf16=default", "--model-arg", "bf16:dtype=bfloat16",
                 "--model", "q4_1_gguf=default", "--model-arg", "q4_1_gguf:load_format=gguf",
                 "--model", f"w8a8={w8}", "--model", f"w8a8_smooth05={w8s}", "--out", str(OUT / "eval.json"))
        res = json.loads((OUT / "eval.json").read_text())["results"]

    ppl = {k: v["ppl"] for k, v in res.items()}
    best_w8 = min(("w8a8", "w8a8_smooth05"), key=ppl.get)
    keys = {"q4_ppl_increase_pct": 100 * (ppl["q4_1_gguf"] / ppl["bf16"] - 1),
            "int8_ppl_increase_pct": 100 * (ppl[best_w8] / ppl["bf16"] - 1)}
    table = {k: {"ppl": v["ppl"], "ppl_float32": v["ppl_baseline"], "ppl_increase_vs_float32_pct": v["ppl_increase_pct"],
                 "task_accuracy": v.get("task_accuracy"), "ppl_increase_vs_bf16_pct": 100 * (v["ppl"] / ppl["bf16"] - 1)}
             for k, v in res.items()}
    doc = {"command": args.command, "int8_checkpoint_used": best_w8,
           **keys, "models": table}
    print(json.dumps(doc, indent=1))
    write_json(OUT / "quality.json", doc)
    if not args.no_summary:
        merge_json(ROOT / "results" / "perf" / "summary.json", keys)
