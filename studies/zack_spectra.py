"""ZACK calibrations' singular-value spectra side by side (e.g. SmolLM2's 64-dim heads, Gemma 3's 256-dim).

    python -m studies.zack_spectra --cal SmolLM2-135M=checkpoints/smollm2-zack \
        --cal gemma-3-270m=~/.cache/swiftserve/zack/gemma3-whitened --out results/models/zack_spectra

Reads each ``zack.json`` (per cache slot and KV head: ``s_qk``, ``s_vo``, the singular values of
the query/key and value/output maps, descending). ZACK's adaptive rule keeps, per head, the
smallest rank whose dropped singular values sum to at most ``eps`` of the total, so the curve
that matters is the cumulative share of the singular-value *sum* against the fraction of
dimensions kept. Writes ``<out>.png`` (mean over heads, with the 10-90% band across heads, for
Q-K and V-O) and ``<out>.json`` (per model: head_dim, heads, and the median fraction of dims
needed to keep 90%, 95% and 99% of the sum).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from benchmarks.lib.records import command_line, write_json

ROOT = Path(__file__).resolve().parent.parent

SHARES = (0.9, 0.95, 0.99)


def spectra(cal_dir: Path) -> dict[str, np.ndarray]:
    """``{"qk": [heads, d], "vo": [heads, d]}`` cumulative share of the singular-value sum."""
    doc = json.loads((cal_dir / "zack.json").read_text())
    out = {}
    for key in ("qk", "vo"):
        s = np.array([h for slot in doc["slots"] for h in slot[f"s_{key}"]], dtype=np.float64)
        out[key] = np.cumsum(s, axis=1) / s.sum(axis=1, keepdims=True)
    return out


def dims_for(cum: np.ndarray, share: float) -> np.ndarray:
    """Per head: fraction of dimensions kept so that the kept sum reaches ``share``."""
    return (np.argmax(cum >= share - 1e-12, axis=1) + 1) / cum.shape[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cal", action="append", required=True, metavar="NAME=DIR", help="a ZACK calibration directory")
    ap.add_argument("--out", default="results/models/zack_spectra")
    args = ap.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    summary = {"command": command_line(argv), "models": {}}
    for spec in args.cal:
        name, _, path = spec.partition("=")
        sp = spectra(Path(path).expanduser())
        d = sp["qk"].shape[1]
        summary["models"][name] = {"head_dim": d, "heads": int(sp["qk"].shape[0]), **{
            f"{key}_median_dims_for_{int(share * 100)}pct": float(np.median(dims_for(sp[key], share)))
            for key in ("qk", "vo") for share in SHARES}}
        x = np.arange(1, d + 1) / d
        for ax, key in zip(axes, ("qk", "vo")):
            lo, hi = np.percentile(sp[key], [10, 90], axis=0)
            line, = ax.plot(x, sp[key].mean(0), label=f"{name} (head_dim {d}, {sp[key].shape[0]} heads)")
            ax.fill_between(x, lo, hi, alpha=0.2, color=line.get_color())
    for ax, title in zip(axes, ("Q-K maps", "V-O maps")):
        ax.set(title=f"ZACK spectra, {title}", xlabel="fraction of head dimensions kept",
               ylabel="share of the singular-value sum kept", ylim=(0, 1.01))
        ax.axhline(0.99, color="grey", lw=0.6, ls="--")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out.with_suffix(".png"), dpi=110)
    write_json(out.with_suffix(".json"), summary)
    print(json.dumps(summary["models"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
