"""KV bytes a sliding-window model holds per token of context, windowed blocks freed or kept.

    python -m benchmarks engine sliding_window_kv --model gemma-3-270m --context 4096 \
        --out results/models/sliding_window_kv.json

One request of ``--context`` prompt tokens is prefilled by the reference engine (chunked, the
engine's default budget) and one token sampled; then, while the request still holds its
cache, the engine's ``kv_bytes_used`` (blocks in use x bytes per block, summed over the block
tables) is read and divided by the context. Run twice: ``free_window_blocks=True`` (windowed
layers keep their own tables and free the blocks their window left) and ``False`` (one table,
every block kept: the layout before windows were freed). The planned bytes per token of the
uncompressed cache (every layer, every token) are reported beside them. Weights are random
(``--load-format dummy``, default): memory does not depend on them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.lib.records import write_json


def held_bytes(model: str, context: int, free: bool, load_format: str) -> dict:
    from refengine.config import EngineConfig
    from refengine.engine import LLMEngine
    from refengine.sampling_params import SamplingParams

    eng = LLMEngine(EngineConfig(model=model, max_model_len=context + 16, load_format=load_format,
                                 kv_cache_memory_gb=1.0, free_window_blocks=free, enable_prefix_caching=False))
    eng.add_request("r", [(7 * i) % 1000 + 10 for i in range(context)], SamplingParams(max_tokens=2, temperature=0))
    while not eng.step():                     # until the prefill's token: the request now holds `context` tokens
        pass
    st = eng.stats()
    used = st.extra["kv_bytes_used"]
    return {"free_window_blocks": free, "kv_bytes_used": used, "bytes_per_token": used / context,
            "blocks_used_per_table": [g.num_used for g in eng.block_manager.groups],
            "table_windows": eng.runner.table_windows,
            "planned_bytes_per_token_all_layers": st.kv_bytes_per_token}


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default="gemma-3-270m", help="model directory or known name")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--load-format", default="dummy", choices=["dummy", "auto"])
    ap.add_argument("--out", default="results/models/sliding_window_kv.json")


def main(args: argparse.Namespace) -> int:
    from modelkit.models import resolve_model

    model = str(resolve_model(args.model))
    runs = [held_bytes(model, args.context, free, args.load_format) for free in (True, False)]
    doc = {"command": args.command, "model": Path(model).name, "context": args.context,
           "freed": runs[0], "kept": runs[1], "ratio_freed_over_kept": runs[0]["bytes_per_token"] / runs[1]["bytes_per_token"]}
    write_json(args.out, doc)
    print(f"{Path(model).name} at {args.context} tokens: {runs[0]['bytes_per_token']:.0f} bytes/token with windowed "
          f"blocks freed, {runs[1]['bytes_per_token']:.0f} kept: ratio {doc['ratio_freed_over_kept']:.3f}")
    return 0
