"""Where a decode step stops being overhead-bound: step time against the tokens it verifies.

    python -m studies.spec_knee --dtype float32 --out results/spec/knee

In-process reference engine (the worker's engine core without HTTP). For each batch size ``b``
(running requests, each decoding after a ``--context``-token prompt) and each draft length ``k``,
every request carries ``k`` drafted tokens (random ids: almost all rejected, so the step's work is
``b * (1 + k)`` verified rows and the requests advance one token a step, as on a workload where
drafts miss) and the median step time over ``--steps`` steps is taken. ``k = 0`` is the plain
decode step. Prints and writes (``<out>.json`` / ``.md``) the table of step times and their ratio
to ``k = 0``: the ratio stays near 1 while the step is overhead-bound (a verified draft is nearly
free there) and grows once its rows cost compute. ``refengine.spec.config.DEFAULT_SCHEDULE`` (the
back-off) is read off this table.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

from benchmarks.lib.records import command_line, write_json


def measure(eng, batch: int, drafts: list[int], context: int, steps: int, seed: int) -> dict[int, float]:
    """Median step ms per draft length, on ``batch`` requests decoding after ``context``-token prompts."""
    from refengine.sampling_params import SamplingParams

    rng = random.Random(seed)
    vocab = eng.spec.vocab_size
    params = SamplingParams(max_tokens=100000, temperature=0, ignore_eos=True)
    ids = [f"b{batch}-{i}" for i in range(batch)]
    for rid in ids:
        eng.add_request(rid, [rng.randrange(100, vocab) for _ in range(context)], params)
    k_now = 0

    def propose(running, enabled_by_default):
        for r in running:
            r.spec_token_ids = [rng.randrange(100, vocab) for _ in range(k_now)] if r.prefilled else []

    eng.drafter.propose = propose
    while any(not eng.scheduler.requests[r].prefilled for r in ids):      # prefill (not timed)
        eng.step()
    out = {}
    for k in drafts:
        k_now = k
        eng.step()                                                         # warm-up of this shape
        times = []
        for _ in range(steps):
            t = time.perf_counter()
            eng.step()
            times.append(time.perf_counter() - t)
        out[k] = 1e3 * statistics.median(times)
        print(f"  batch {batch:3d} draft {k:2d}: {out[k]:7.2f} ms/step ({out[k] / out[drafts[0]]:.2f}x)", flush=True)
    for rid in ids:
        eng.abort_request(rid)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 24, 32, 48])
    ap.add_argument("--drafts", type=int, nargs="+", default=[0, 2, 4, 8, 12, 16])
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--out", default="results/spec/knee")
    args = ap.parse_args(argv)
    from modelkit.models import resolve_model
    from refengine.config import EngineConfig
    from refengine.engine import LLMEngine

    eng = LLMEngine(EngineConfig(model=str(resolve_model(args.model)), dtype=args.dtype, torch_threads=args.threads,
                                 max_model_len=4096, max_num_seqs=max(args.batches), kv_cache_memory_gb=2.0,
                                 max_num_batched_tokens=4096, speculative_config={"method": "suffix"}))
    table = {}
    for i, b in enumerate(args.batches):
        table[b] = measure(eng, b, args.drafts, args.context, args.steps, seed=i)
    # Least-squares line through every (rows verified, ms) point: T = T0 + c * rows; the knee T0 / c is where
    # the per-row part overtakes the fixed part (refengine.spec.config.KNEE_TOKENS).
    pts = [(b * (1 + k), v) for b, row in table.items() for k, v in row.items()]
    n = len(pts)
    mx, my = sum(x for x, _ in pts) / n, sum(y for _, y in pts) / n
    c = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
    t0 = my - c * mx
    doc = {"command": command_line(argv), "dtype": args.dtype, "threads": args.threads, "context": args.context,
           "steps": args.steps, "fit": {"fixed_ms": round(t0, 3), "ms_per_row": round(c, 4), "knee_rows": round(t0 / c, 1)},
           "ms_per_step": {str(b): {str(k): round(v, 3) for k, v in row.items()} for b, row in table.items()}}
    write_json(args.out + ".json", doc)
    k0 = args.drafts[0]
    lines = [f"# Decode step time against verified draft tokens ({args.dtype}, context {args.context})", "",
             f"`{doc['command']}`", "", "ms per step (ratio to no draft); rows: running requests, columns: "
             "drafted tokens per request", "",
             "| batch | " + " | ".join(f"k={k}" for k in args.drafts) + " |",
             "|---:|" + "---:|" * len(args.drafts)]
    for b, row in table.items():
        lines.append(f"| {b} | " + " | ".join(f"{row[k]:.1f} ({row[k] / row[k0]:.2f})" for k in args.drafts) + " |")
    f = doc["fit"]
    lines += ["", f"Least-squares fit over every cell: step = {f['fixed_ms']:.1f} ms + {f['ms_per_row']:.3f} ms x rows "
                  f"verified; the fixed part dominates below {f['knee_rows']:.0f} rows (the knee)."]
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
