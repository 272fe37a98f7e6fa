"""``modelkit plot-distill``: the training curve of a distillation run as a PNG.

Reads ``train_log.jsonl`` (one JSON line per optimiser step, written by
``modelkit distill``) and draws, per AcrossKV group size ``g``: the training loss
(KL at the training temperature times T^2, moving average over ``--smooth`` steps)
and the held-out KL at temperature 1 at each evaluation, against tokens seen. When
the run directory has ``init.json`` (its starting point's held-out KL), that is the
held-out curve's point at 0 tokens.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path


def read_log(run_dir: Path) -> list[dict]:
    path = run_dir / "train_log.jsonl"
    if not path.is_file():
        raise SystemExit(f"{path} does not exist: is {run_dir} a `modelkit distill --output` directory?")
    with open(path) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    # A resumed run may repeat steps after its last save: keep the last record of each step.
    by_step = {r["step"]: r for r in recs}
    return [by_step[s] for s in sorted(by_step)]


def moving_average(xs: list[float], k: int) -> list[float]:
    out, acc = [], 0.0
    for i, x in enumerate(xs):
        acc += x
        if i >= k:
            acc -= xs[i - k]
        out.append(acc / min(i + 1, k))
    return out


def initial_kl(run_dir: Path) -> dict[str, float]:
    """The starting point's held-out KL by group size (from init.json; empty if the run has none)."""
    path = run_dir / "init.json"
    return json.loads(path.read_text()).get("heldout_kl_T1", {}) if path.is_file() else {}


def heldout_points(recs: list[dict], g: int, start: dict[str, float]) -> list[tuple[float, float]]:
    """(million tokens, held-out KL) of group g, beginning at 0 tokens with ``start[str(g)]`` when known."""
    pts = [(0.0, float(start[str(g)]))] if str(g) in start else []
    return pts + [(r["tokens"] / 1e6, r[f"heldout_kl_g{g}"]) for r in recs if f"heldout_kl_g{g}" in r]


def plot_run(run_dir: Path, out: Path | None = None, smooth: int = 10) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = read_log(run_dir)
    groups = sorted({int(m.group(1)) for r in recs for k in r if (m := re.fullmatch(r"loss_g(\d+)", k))})
    start = initial_kl(run_dir)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for g in groups:
        pts = [(r["tokens"] / 1e6, r[f"loss_g{g}"]) for r in recs if f"loss_g{g}" in r]
        ax1.plot([p[0] for p in pts], moving_average([p[1] for p in pts], smooth), label=f"g={g}")
        ev = heldout_points(recs, g, start)
        if ev:
            ax2.plot([p[0] for p in ev], [p[1] for p in ev], marker="o", label=f"g={g}")
    ax1.set(title=f"training loss (T^2 KL, {smooth}-step mean)", xlabel="tokens seen (M)", ylabel="loss")
    ax2.set(title="held-out KL(teacher || student), T=1", xlabel="tokens seen (M)", ylabel="nats / token")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.suptitle(f"SwiftKV distillation: {run_dir.name}")
    fig.tight_layout()
    out = out or run_dir / "train_curve.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plot-distill", help="plot a distillation run's training and held-out KL",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", help="the --output directory of `modelkit distill`")
    p.add_argument("--out", default=None, help="PNG path (default: RUN_DIR/train_curve.png)")
    p.add_argument("--smooth", type=int, default=10, help="moving-average window in steps (default: %(default)s)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out = plot_run(Path(args.run_dir), Path(args.out) if args.out else None, args.smooth)
    print(out)
    return 0
