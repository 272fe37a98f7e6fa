"""What the vLLM GPU checks conclude, in one place for the tests and the session's summary.

``tests/gpu/test_vllm_gpu.py`` runs ``swiftserve_vllm.probe`` on CUDA and asserts with these
rules; with ``SWIFTSERVE_GPU_VLLM_RESULTS`` set it also records each probe run there
(``record``), and the session's ``vllm-tests`` stage derives the summary keys from that file
(``summary``): nothing is taken from a run that did not happen on CUDA.

Greedy parity: two bf16 implementations (different kernels: inductor's fused ones and CUDA graphs,
vLLM's eager custom ops, the reference engine's torch ops on the CPU) produce the same tokens until
they part, if ever, at a near-tie of the compiled run: the other's token is one of its two
likeliest there, less than ``TIE`` nats apart (the probe records them, ``top2``); after that the
texts differ legitimately. Records without ``top2`` fall back to the first ``REFERENCE_TOKENS`` /
``EAGER_TOKENS`` tokens being equal. (The CPU suite's float32 parity rules near-ties out exactly.)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

REFERENCE_TOKENS = 4          # without top2: compiled vs the reference engine (or ZACK's torch reference)
EAGER_TOKENS = 6              # without top2: compiled with CUDA graphs vs the same model eager
TIE = 0.25                    # nats between the two likeliest tokens below which bf16 kernels may differ
RESULTS_ENV = "SWIFTSERVE_GPU_VLLM_RESULTS"


def agree(a: list[list[int]], b: list[list[int]], n: int, top2: list | None = None, tie: float = TIE) -> bool:
    """Every prompt's first ``n`` tokens equal (both produced that many), or, with ``top2`` (``a``'s two
    likeliest tokens and log-probs per position), equal up to a near-tie of ``a`` where ``b`` took the
    other of the two."""
    if len(a) != len(b):
        return False
    for p, (x, y) in enumerate(zip(a, b)):
        if len(x) < n or len(y) < n:
            return False
        for i in range(n):
            if x[i] == y[i]:
                continue
            rows = top2[p] if top2 and p < len(top2) else []
            if i < len(rows) and len(rows[i]) == 2:
                (t1, l1), (t2, l2) = rows[i]
                if y[i] in (t1, t2) and l1 - l2 < tie:
                    break                         # a near-tie: the texts may part here
            return False
    return True


def parity(r: dict, other: list[list[int]], n_without_top2: int) -> bool:
    """A record's tokens against ``other`` by the rule above (all its tokens when it has ``top2``)."""
    top2 = r.get("top2")
    n = min(len(t) for t in r["tokens"]) if top2 else n_without_top2
    return agree(r["tokens"], other, n, top2)


def reference_of(r: dict) -> list[list[int]] | None:
    """The tokens a probe record is compared with: the reference engine's, for ZACK without SwiftKV
    the torch reference of ZACK's semantics (the reference engine reads no ZACK checkpoint)."""
    return r.get("torch_reference_tokens") or r.get("reference_tokens")


def compiled_parity(r: dict) -> bool:
    """A compiled, CUDA-graph run agrees with its reference and, if it has one, its eager run."""
    ref = reference_of(r)
    ok = ref is not None and parity(r, ref, REFERENCE_TOKENS)
    if "eager_tokens" in r:
        ok = ok and parity(r, r["eager_tokens"], EAGER_TOKENS)
    return ok


def on_cuda_with_graphs(r: dict) -> bool:
    return (r.get("device") == "cuda" and r.get("enforce_eager") is False
            and r.get("graphs", {}).get("num_cudagraph_captured", 0) > 0)


def probe_dir() -> Path | None:
    """``vllm-probes/`` beside the results file (each probe's live log and partial ``--out``; the
    session collects it, so a stage stopped by its time limit still shows where every group was),
    or None when no results file is named."""
    path = os.environ.get(RESULTS_ENV)
    if not path:
        return None
    d = Path(path).parent / "vllm-probes"
    d.mkdir(parents=True, exist_ok=True)
    return d


def record(group: str, results: list[dict]) -> None:
    """Add one probe run's records under ``group`` to the file ``$SWIFTSERVE_GPU_VLLM_RESULTS`` names.
    xdist workers finish at the same time: the read-modify-write holds an exclusive lock."""
    import fcntl

    path = os.environ.get(RESULTS_ENV)
    if not path:
        return
    p = Path(path)
    with open(p.with_name(p.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        doc = json.loads(p.read_text()) if p.is_file() else {}
        doc[group] = results
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        tmp.replace(p)


def _fp8(r: dict) -> bool:
    return r.get("kv_cache_dtype", "auto") != "auto" or bool(r.get("quantization"))


def summary(doc: dict) -> dict:
    """The summary keys a results file supports: ``vllm_gpu_runs`` once any plugin model produced
    tokens on CUDA with graphs, ``vllm_cuda_graph_greedy_parity`` over every 16-bit run compared with
    a reference (absent when none was). Runs with an FP8 KV cache or FP8 weights are not parity runs
    against the bf16 reference (their tests ask for the first token and a log-prob gap instead)."""
    runs = [r for group in doc.values() for r in group]
    graphed = [r for r in runs if on_cuda_with_graphs(r) and r.get("tokens")]
    out: dict = {}
    if graphed:
        out["vllm_gpu_runs"] = True
        compared = [r for r in graphed if reference_of(r) is not None and not _fp8(r)]
        if compared:
            out["vllm_cuda_graph_greedy_parity"] = all(compiled_parity(r) for r in compared)
    return out
