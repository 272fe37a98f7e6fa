"""GPU benchmark of the reference engine: Llama-3.1-8B shape, random bf16 weights, no vLLM needed.

    python -m benchmarks engine gpu                       # CUDA, 8B shape -> results/perf/gpu/<device>.json
    python -m benchmarks engine gpu --tiny --device cpu   # a tiny shape: checks the script anywhere

Needs torch (triton / transformers only as the engine does) and this project. Measures,
through ``LLMEngine`` with ``load_format="dummy"`` (weights drawn on the device):
- prefill: one ``--prefill-tokens`` prompt computed in one step (the budget covers it),
  baseline vs 50% SwiftKV (``num_key_value_layers = L/2``); median step time and the
  ratio SwiftKV / baseline (the papers' FLOP limit is about 0.51; target <= 0.55);
- decode: ``--batches`` sequences of ``--context`` tokens, median time of one decode step
  against the memory-bandwidth limit = (weight bytes + KV bytes read) / bandwidth, the
  bandwidth measured here with a large device-to-device copy (target: within 1.5x). On CUDA the
  engine replays decode steps from CUDA graphs (refengine.graph_decode; ``cuda_graphs`` in the
  record); each batch is then measured again with every step eager on the same engine
  (``decode_ms_eager_b*``, ``cuda_graph_speedup_b*``); then the step at the largest batch with
  each KV method of ``--methods`` (``decode_ms_by_method``, ``cuda_graphs_by_method``: which ran
  from graphs; KV methods run eagerly).
Timings synchronise the device (the engine's sampled tokens come back to the host each step).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

LLAMA_8B = {"vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0, "max_position_embeddings": 131072, "tie_word_embeddings": False,
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 8192}}
# KV methods measured by --methods (ZACK needs a calibrated model, which random weights are not).
METHODS = {"plain": {}, "fp8": {"fp8": {}}, "kcache": {"kcache": {"top_n": 256}}, "zipcache": {"zipcache": {}},
           "eviction": {"eviction": {"budget": 256}}}
# CPU only: the engine's C++ kernels as it picks them, or plain torch ops (no kernel build: quick checks).
CPU_KERNELS = {"auto": {}, "torch": {"decode_kernel": "torch", "prefill_kernel": "torch", "fused_ops": "torch"}}
TINY = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "max_position_embeddings": 4096, "tie_word_embeddings": True}


def write_config(shape: dict, root: Path) -> Path:
    """A SwiftKV-capable config (l = L/2, g = 1); SwiftKV off in the engine = the baseline model."""
    L = shape["num_hidden_layers"]
    cfg = {**shape, "architectures": ["LlamaSwiftKVForCausalLM"], "model_type": "llama_swiftkv", "swiftkv": True,
           "num_key_value_layers": L // 2, "key_value_group_size": 1, "hidden_act": "silu",
           "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16"}
    (root / "config.json").write_text(json.dumps(cfg))
    return root


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def engine(model_dir: Path, args, swiftkv: bool, max_tokens: int, kv_methods: dict | None = None):
    from refengine.config import EngineConfig
    from refengine.engine import LLMEngine

    return LLMEngine(EngineConfig(model=str(model_dir), device=args.device, dtype=args.dtype, load_format="dummy",
                                  swiftkv=swiftkv, max_model_len=max(args.prefill_tokens, args.context) + 64,
                                  max_num_batched_tokens=max_tokens, max_num_seqs=max(args.batches) + 1,
                                  kv_cache_memory_gb=args.kv_gb, enable_prefix_caching=False,
                                  long_prefill_token_threshold=0, kv_methods=kv_methods or {},
                                  **CPU_KERNELS[args.cpu_kernels]))


def decode_by_method(model_dir: Path, args, res: dict) -> None:
    """The decode step at the largest batch with each KV method of ``--methods`` (one engine each); the
    plain cache's figure is the baseline engine's, measured above."""
    import torch

    b = res["methods_batch"] = max(args.batches)
    res["decode_ms_by_method"] = {"plain": res[f"decode_ms_b{b}"]}
    res["cuda_graphs_by_method"] = {"plain": res["cuda_graphs"]}
    for name in [m for m in args.methods if m != "plain"]:
        eng = engine(model_dir, args, False, args.prefill_tokens, METHODS[name])
        res["decode_ms_by_method"][name] = decode_ms(eng, args, b)
        res["cuda_graphs_by_method"][name] = eng.runner.graphs is not None
        del eng
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()


def prefill_ms(eng, args) -> float:
    from refengine.sampling_params import SamplingParams

    times = []
    for r in range(args.repeats + 1):                  # the first is a warm-up
        eng.add_request(f"pf{r}", [(7 * i + r) % 500 + 3 for i in range(args.prefill_tokens)],
                        SamplingParams(max_tokens=1, ignore_eos=True))
        sync(args.device)
        t = time.perf_counter()
        while eng.has_unfinished():
            eng.step()
        sync(args.device)
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times[1:])


def decode_ms(eng, args, batch: int) -> float:
    from refengine.sampling_params import SamplingParams

    steps = args.decode_steps
    for b in range(batch):
        eng.add_request(f"d{batch}-{b}", [(11 * i + b) % 500 + 3 for i in range(args.context)],
                        SamplingParams(max_tokens=steps + 4, ignore_eos=True))
    while not all(r.prefilled for r in eng.scheduler.running) or eng.scheduler.waiting:
        eng.step()                                      # prefill everything first
    times = []
    while eng.has_unfinished():
        sync(args.device)
        t = time.perf_counter()
        eng.step()
        sync(args.device)
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times[1:-1] or times)


def bandwidth_gbs(device: str) -> float:
    import torch

    n = (1 << 30) if device.startswith("cuda") else (1 << 26)
    a = torch.empty(n, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    times = []
    for _ in range(6):
        sync(device)
        t = time.perf_counter()
        b.copy_(a)
        sync(device)
        times.append(time.perf_counter() - t)
    return 2 * n / statistics.median(times[1:]) / 1e9       # read + write



def _ptr(t) -> int:
    """Storage address (tied tensors share it); prepacked oneDNN weights have no storage: their id."""
    try:
        return t.data_ptr()
    except RuntimeError:
        return id(t)

def add_cli_args(ap: argparse.ArgumentParser) -> None:
    import torch
    ap.add_argument("--tiny", action="store_true", help="a tiny model shape (the script's own check)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--prefill-tokens", type=int, default=None, help="default 8192 (tiny: 256)")
    ap.add_argument("--context", type=int, default=None, help="decode context per sequence (default 1024; tiny 64)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--decode-steps", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kv-gb", type=float, default=None, help="KV pool (default 16 GiB; tiny 0.05)")
    ap.add_argument("--cpu-kernels", choices=sorted(CPU_KERNELS), default="auto",
                    help="CPU: the engine's C++ kernels (auto) or torch ops (torch: nothing to build)")
    ap.add_argument("--methods", default=",".join(METHODS),
                    help=f"KV methods whose decode step is measured at the largest batch, comma-separated from "
                         f"{', '.join(METHODS)} ('' for none; the issue's ref_decode_ms_by_method)")
    ap.add_argument("--out", default=None, help="JSON path (default results/perf/gpu/<device name>.json)")


def main(args: argparse.Namespace) -> int:
    import torch

    args.methods = [m for m in args.methods.split(",") if m]
    unknown = [m for m in args.methods if m not in METHODS]
    if unknown:
        raise SystemExit(f"--methods: unknown {', '.join(unknown)} (known: {', '.join(METHODS)})")
    args.prefill_tokens = args.prefill_tokens or (256 if args.tiny else 8192)
    args.context = args.context or (64 if args.tiny else 1024)
    args.kv_gb = args.kv_gb or (0.05 if args.tiny else 16.0)
    shape = TINY if args.tiny else LLAMA_8B
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_config(shape, Path(tmp))
        res: dict = {"device": name, "shape": "tiny" if args.tiny else "llama-3.1-8b", "dtype": args.dtype,
                     "torch": torch.__version__, "prefill_tokens": args.prefill_tokens, "context": args.context}
        bw = bandwidth_gbs(args.device)
        res["copy_bandwidth_gbs"] = bw
        for swift in (False, True):
            eng = engine(model_dir, args, swift, args.prefill_tokens)
            res["prefill_ms_swiftkv" if swift else "prefill_ms_baseline"] = prefill_ms(eng, args)
            if not swift:
                m = eng.runner.model               # a decode step reads every weight but the embedding table
                tensors = {_ptr(p): p.numel() * p.element_size() for p in m.parameters()}  # tied: once
                weight_bytes = sum(tensors.values())
                head = getattr(m.lm_head, "weight", None)
                if head is None or _ptr(head) != _ptr(m.embed):
                    weight_bytes -= m.embed.numel() * m.embed.element_size()
                kv_per_token = eng.runner.kv.bytes_per_token
                res["weight_bytes"], res["kv_bytes_per_token"] = weight_bytes, kv_per_token
                graphs = eng.runner.graphs             # refengine.graph_decode (CUDA), else None
                res["cuda_graphs"] = graphs is not None
                for b in args.batches:
                    ms = decode_ms(eng, args, b)
                    limit = 1e3 * (weight_bytes + b * (args.context + args.decode_steps // 2) * kv_per_token) / (bw * 1e9)
                    res[f"decode_ms_b{b}"], res[f"decode_limit_ms_b{b}"] = ms, limit
                    res[f"decode_vs_limit_b{b}"] = ms / limit
                    if graphs is not None:             # the same engine with every step eager, side by side
                        eng.runner.graphs = None
                        res[f"decode_ms_eager_b{b}"] = decode_ms(eng, args, b)
                        eng.runner.graphs = graphs
                        res[f"cuda_graph_speedup_b{b}"] = res[f"decode_ms_eager_b{b}"] / ms
            del eng
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()
        if args.methods:
            decode_by_method(model_dir, args, res)
        res["swiftkv_prefill_ratio"] = res["prefill_ms_swiftkv"] / res["prefill_ms_baseline"]
    out = Path(args.out) if args.out else Path("results/perf/gpu") / f"{name.replace(' ', '_')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res, indent=1))
    return 0
