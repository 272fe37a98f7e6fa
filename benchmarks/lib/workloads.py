"""The workloads every benchmark draws from: one table, and the requests of a workload.

``WORKLOADS``: name -> ``Workload(input_len, output_len, prompts, rate, metric)``: the prompt and
output lengths, how many prompts one run sends (at ``--scale 1``), their arrival rate (inf: all at
once) and the headline metric of the serving suite. ``SERVING`` is the serving suite's table
(``decode_1024_128`` runs in process only); ``ENGINE`` the names an in-process engine run takes
(no shared-prefix workload). ``requests_for(name, n, seed)``: the ``loadtest.datasets`` requests
of one run (random prompts, or one shared 1024-token prefix for ``prefix_*``).
``add_attention_shape_args``: one layer's attention shape, for the kernel benchmarks.
"""

from __future__ import annotations

import math
from typing import NamedTuple


class Workload(NamedTuple):
    input_len: int
    output_len: int
    prompts: int
    rate: float
    metric: str


WORKLOADS: dict[str, Workload] = {
    "chat_256_16": Workload(256, 16, 16, 4.0, "output_throughput"),
    "prefill_1024_32": Workload(1024, 32, 16, math.inf, "total_token_throughput"),
    "decode_128_128": Workload(128, 128, 32, math.inf, "output_throughput"),
    "prefix_1024_64": Workload(1024, 4, 8, math.inf, "median_ttft_ms"),
    "decode_1024_128": Workload(1024, 128, 32, math.inf, "output_throughput"),   # decode over long (RAG-like) contexts
}
SERVING: dict[str, Workload] = {w: WORKLOADS[w] for w in ("chat_256_16", "prefill_1024_32", "decode_128_128",
                                                          "prefix_1024_64")}
ENGINE: tuple[str, ...] = tuple(w for w in WORKLOADS if not w.startswith("prefix"))


def requests_for(name: str, n: int, seed: int):
    from loadtest.datasets import random_prompts, shared_prefix_prompts

    n_in, n_out = WORKLOADS[name][:2]
    if name.startswith("prefix"):
        return shared_prefix_prompts(n, n_in, 64, n_out, num_prefixes=1, seed=seed)
    return random_prompts(n, n_in, n_out, seed=seed)


def add_attention_shape_args(ap) -> None:
    """One layer's attention shape (SmolLM2's by default) and the prefill/decode sizes, for kernel benchmarks."""
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--prefill-len", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--context", type=int, default=200)
