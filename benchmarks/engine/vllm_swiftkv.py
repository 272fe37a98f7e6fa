"""vLLM baseline vs vLLM + SwiftKV (SwiftServe's plugin) on a prefill-heavy workload, beside
the reference engine; plus AcrossKV's KV capacity and ZACK serving. Prints ratios.

Run in the vLLM environment (CPU: ``make vllm-env``; GPU: ``make vllm-env VLLM_EXTRA=vllm
TORCH_SPEC=torch``), e.g.:
  .venv-vllm/bin/python -m benchmarks engine vllm_swiftkv --out results/vllm

Engines (same dtype and KV budget, prefix caching off, one request at a time):
  vllm-base     stock vLLM Llama on the original SmolLM2 (the baseline)
  vllm-swiftkv  the plugin on SmolLM2-SwiftKV (l=15, g=1), kv_sharing_fast_prefill on
  ref-base / ref-swiftkv  the reference engine on the same two checkpoints
Each round draws a fresh random prompt of --input-len tokens and runs it on every engine in
turn (interleaved, so machine noise hits all alike): prefill = wall time of a 1-token
generation; e2e = --output-len tokens (ignore_eos). Medians over --rounds; ratios are
SwiftKV / baseline within one engine. Then the AcrossKV (g=2) and ZACK (rank 32, rotations
from the weights' SVD unless --zack DIR) checkpoints are loaded one after another for their
KV capacity, greedy parity and serving. Writes bench.md, raw.json and summary.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

PARITY_PROMPTS = [[1, 504, 3575, 282, 4649, 314], [1, 9690, 198, 2683, 359, 253, 5356, 11173, 30, 2]]


def _vllm_engine(V, model_dir: str, device: str, kv_gb: float, max_len: int):
    from refengine.config import EngineConfig
    from worker.backends.vllm import build_settings
    from worker.config import WorkerConfig

    s = build_settings(WorkerConfig(EngineConfig(model=model_dir, max_model_len=max_len, kv_cache_memory_gb=kv_gb,
                                                 max_num_seqs=8, max_num_batched_tokens=max_len)), device)
    os.environ.update(s.env)
    kw = {k: v for k, v in s.engine_kwargs.items() if k not in ("served_model_name", "disable_log_stats")}
    # Same KV budget on every device (on GPU two engines share the card), eager everywhere
    # (as the SwiftKV paper measured; the plugin's model is not CUDA-graph safe yet).
    kw.update(kv_cache_memory_bytes=int(kv_gb * 2 ** 30), enforce_eager=True, gpu_memory_utilization=0.4)
    llm = V.LLM(enable_prefix_caching=False, **kw)
    cc = llm.llm_engine.vllm_config.cache_config
    return llm, int(cc.num_gpu_blocks) * int(cc.block_size), s


class _VllmRunner:
    def __init__(self, V, llm):
        self.V, self.llm = V, llm

    def run(self, prompt: list[int], n: int, greedy_check: bool = False) -> list[int]:
        p = self.V.SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=not greedy_check)
        return list(self.llm.generate([{"prompt_token_ids": prompt}], p, use_tqdm=False)[0].outputs[0].token_ids)


class _RefRunner:
    def __init__(self, model_dir: str, kv_gb: float, max_len: int):
        from refengine.config import EngineConfig
        from refengine.engine import LLMEngine

        self.eng = LLMEngine(EngineConfig(model=model_dir, max_model_len=max_len, kv_cache_memory_gb=kv_gb,
                                          max_num_batched_tokens=max_len))

    def run(self, prompt: list[int], n: int, greedy_check: bool = False) -> list[int]:
        from refengine.sampling_params import SamplingParams

        return self.eng.generate([prompt], SamplingParams(max_tokens=n, temperature=0.0,
                                                          ignore_eos=not greedy_check))[0]


def _timed(fn, *a) -> float:
    t = time.perf_counter()
    fn(*a)
    return time.perf_counter() - t


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--input-len", type=int, default=2000)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kv-gb", type=float, default=1.0)
    ap.add_argument("--no-reference", action="store_true", help="skip the reference engine")
    ap.add_argument("--zack", default=None, help="ZACK checkpoint directory (default: rank 32 made from the base)")
    ap.add_argument("--out", default=None, help="directory for bench.md, raw.json, summary.json")


def main(args: argparse.Namespace) -> int:
    from modelkit.models import resolve_model
    from swiftserve_vllm import compat as V

    device = V.platform_device()
    base, g1, g2 = (str(resolve_model(n)) for n in ("default", "SmolLM2-135M-Instruct-SwiftKV",
                                                     "SmolLM2-135M-Instruct-SwiftKV-AcrossKV2"))
    max_len = args.input_len + args.output_len + 16
    engines, capacity = {}, {}
    llm_b, capacity["vllm-base"], _ = _vllm_engine(V, base, device, args.kv_gb, max_len)
    engines["vllm-base"] = _VllmRunner(V, llm_b)
    llm_s, capacity["vllm-swiftkv"], _ = _vllm_engine(V, g1, device, args.kv_gb, max_len)
    engines["vllm-swiftkv"] = _VllmRunner(V, llm_s)
    if not args.no_reference:
        engines["ref-base"] = _RefRunner(base, args.kv_gb, max_len)
        engines["ref-swiftkv"] = _RefRunner(g1, args.kv_gb, max_len)
    parity = {"g1": engines["vllm-swiftkv"].run(PARITY_PROMPTS[0], 12, True)}
    warm = [random.Random(-1).randrange(100, 40000) for _ in range(64)]
    for e in engines.values():                      # first-call costs out of the measurement
        e.run(warm, 2)
    times: dict[str, dict[str, list[float]]] = {k: {"prefill": [], "e2e": []} for k in engines}
    for r in range(args.rounds):
        rng = random.Random(r)
        prompt = [rng.randrange(100, 40000) for _ in range(args.input_len)]
        for name, e in engines.items():
            times[name]["prefill"].append(_timed(e.run, prompt, 1))
            times[name]["e2e"].append(_timed(e.run, prompt, args.output_len))
            print(f"round {r} {name}: prefill {times[name]['prefill'][-1]:.2f} s, "
                  f"e2e {times[name]['e2e'][-1]:.2f} s", flush=True)
    med = {k: {m: statistics.median(v) for m, v in d.items()} for k, d in times.items()}
    ref_tokens = None
    if not args.no_reference:
        ref_tokens = {"g1": engines["ref-swiftkv"].run(PARITY_PROMPTS[0], 12, True)}
    del engines, llm_b, llm_s
    gc.collect()
    # AcrossKV and ZACK: one engine at a time, same KV budget.
    llm, capacity["vllm-acrosskv-g2"], _ = _vllm_engine(V, g2, device, args.kv_gb, max_len)
    parity["g2"] = _VllmRunner(V, llm).run(PARITY_PROMPTS[0], 12, True)
    del llm
    gc.collect()
    zdir = args.zack
    if zdir is None:
        from swiftserve_vllm.reference import make_random_zack

        zdir = str(make_random_zack(base, Path(tempfile.mkdtemp()) / "zack-r32", 32, kind="weights"))
    llm, capacity["vllm-zack"], zs = _vllm_engine(V, zdir, device, args.kv_gb, max_len)
    zack_tokens = _VllmRunner(V, llm).run(PARITY_PROMPTS[0], 12, True)
    del llm
    gc.collect()
    from swiftserve_vllm.reference import zack_greedy

    zack_expected = zack_greedy(zdir, PARITY_PROMPTS[0], 12) if not zs.layout.swiftkv else None
    if ref_tokens is not None:
        ref_tokens["g2"] = _RefRunner(g2, 0.2, 1024).run(PARITY_PROMPTS[0], 12, True)
    summary = {
        "swiftkv_greedy_parity": bool(ref_tokens is not None and parity == ref_tokens),
        "acrosskv_g2_kv_capacity_ratio": round(capacity["vllm-acrosskv-g2"] / capacity["vllm-swiftkv"], 4),
        "swiftkv_prefill_ratio": round(med["vllm-swiftkv"]["prefill"] / med["vllm-base"]["prefill"], 4),
        "zack_served": bool(len(zack_tokens) == 12 and (zack_expected is None or zack_tokens == zack_expected)),
    }
    exe = os.path.relpath(sys.executable) if not os.path.relpath(sys.executable).startswith("..") else sys.executable
    raw = {"command": args.command.replace("python ", exe + " ", 1), "device": device,      # which venv ran it
           "vllm": V.installed_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
           "input_len": args.input_len, "output_len": args.output_len, "rounds": args.rounds, "kv_gb": args.kv_gb,
           "times": times, "medians": med, "kv_capacity_tokens": capacity, "parity_vllm": parity,
           "parity_reference": ref_tokens, "zack_dir": zdir, "zack_tokens": zack_tokens,
           "zack_torch_reference": zack_expected, "summary": summary}
    table = _table(med, capacity, summary, raw)
    print(table)
    print(json.dumps(summary))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "raw.json").write_text(json.dumps(raw, indent=1))
        (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        (out / "bench.md").write_text(table)
    return 0


def _table(med, capacity, summary, raw) -> str:
    lines = [f"# vLLM + SwiftKV, {raw['input_len']} in / {raw['output_len']} out, one request at a time",
             "", f"Command: `{raw['command']}` (vLLM {raw['vllm']} on {raw['device']}, {raw['cpus']} CPUs; "
             f"medians of {raw['rounds']} interleaved rounds)", "",
             "| engine | prefill (s) | e2e (s) | KV capacity (tokens) |", "|---|---|---|---|"]
    for k, m in med.items():
        lines.append(f"| {k} | {m['prefill']:.2f} | {m['e2e']:.2f} | {capacity.get(k, '')} |")
    lines += ["", "| ratio | value |", "|---|---|",
              f"| vLLM SwiftKV / vLLM baseline, prefill | {summary['swiftkv_prefill_ratio']:.3f} |",
              f"| vLLM SwiftKV / vLLM baseline, e2e | {med['vllm-swiftkv']['e2e'] / med['vllm-base']['e2e']:.3f} |"]
    if "ref-base" in med:
        lines += [f"| reference SwiftKV / reference baseline, prefill | "
                  f"{med['ref-swiftkv']['prefill'] / med['ref-base']['prefill']:.3f} |",
                  f"| vLLM baseline / reference baseline, prefill | "
                  f"{med['vllm-base']['prefill'] / med['ref-base']['prefill']:.3f} |",
                  f"| vLLM SwiftKV / reference SwiftKV, prefill | "
                  f"{med['vllm-swiftkv']['prefill'] / med['ref-swiftkv']['prefill']:.3f} |"]
    lines += [f"| AcrossKV g=2 / g=1 KV capacity (vLLM) | {summary['acrosskv_g2_kv_capacity_ratio']:.3f} |",
              f"| ZACK rank 32 / g=1 KV capacity (vLLM) | {capacity['vllm-zack'] / capacity['vllm-swiftkv']:.3f} |",
              "", f"summary: `{json.dumps(summary)}`", ""]
    return "\n".join(lines)
