"""What the vLLM GPU checks conclude, in one place for the tests and the session's summary.

``tests/gpu/test_vllm_gpu.py`` runs ``swiftserve_vllm.probe`` on CUDA and asserts with these
rules; with ``SWIFTSERVE_GPU_VLLM_RESULTS`` set it also records each probe run there
(``record``), and the session's ``vllm-tests`` stage derives the summary keys from that file
(``summary``): nothing is taken from a run that did not happen on CUDA.

Greedy parity: two bf16 implementations (different kernels: inductor's fused ones and CUDA graphs,
vLLM's eager custom ops, the reference engine's torch ops on the CPU) agree on the first tokens;
a later token may part at a near-tie (the CPU suite's float32 parity rules that out exactly).
Compiled against eager is the same engine on the same GPU: more tokens must agree.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

REFERENCE_TOKENS = 4          # compiled vs the reference engine (or ZACK's torch reference)
EAGER_TOKENS = 6              # compiled with CUDA graphs vs the same model eager
RESULTS_ENV = "SWIFTSERVE_GPU_VLLM_RESULTS"


def agree(a: list[list[int]], b: list[list[int]], n: int) -> bool:
    """Every prompt's first ``n`` tokens equal (and both produced that many)."""
    return len(a) == len(b) and all(len(x) >= n and x[:n] == y[:n] for x, y in zip(a, b))


def reference_of(r: dict) -> list[list[int]] | None:
    """The tokens a probe record is compared with: the reference engine's, for ZACK without SwiftKV
    the torch reference of ZACK's semantics (the reference engine reads no ZACK checkpoint)."""
    return r.get("torch_reference_tokens") or r.get("reference_tokens")


def compiled_parity(r: dict) -> bool:
    """A compiled, CUDA-graph run agrees with its reference and, if it has one, its eager run."""
    ref = reference_of(r)
    ok = ref is not None and agree(r["tokens"], ref, REFERENCE_TOKENS)
    if "eager_tokens" in r:
        ok = ok and agree(r["tokens"], r["eager_tokens"], EAGER_TOKENS)
    return ok


def on_cuda_with_graphs(r: dict) -> bool:
    return (r.get("device") == "cuda" and r.get("enforce_eager") is False
            and r.get("graphs", {}).get("num_cudagraph_captured", 0) > 0)


def record(group: str, results: list[dict]) -> None:
    """Add one probe run's records under ``group`` to the file ``$SWIFTSERVE_GPU_VLLM_RESULTS`` names."""
    path = os.environ.get(RESULTS_ENV)
    if not path:
        return
    p = Path(path)
    doc = json.loads(p.read_text()) if p.is_file() else {}
    doc[group] = results
    p.write_text(json.dumps(doc, indent=1))


def summary(doc: dict) -> dict:
    """The summary keys a results file supports: ``vllm_gpu_runs`` once any plugin model produced
    tokens on CUDA with graphs, ``vllm_cuda_graph_greedy_parity`` over every run compared with a
    reference (absent when none was)."""
    runs = [r for group in doc.values() for r in group]
    graphed = [r for r in runs if on_cuda_with_graphs(r) and r.get("tokens")]
    out: dict = {}
    if graphed:
        out["vllm_gpu_runs"] = True
        compared = [r for r in graphed if reference_of(r) is not None]
        if compared:
            out["vllm_cuda_graph_greedy_parity"] = all(compiled_parity(r) for r in compared)
    return out
