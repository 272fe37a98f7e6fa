"""``python -m swiftserve_vllm.probe``: what vLLM (with the plugin) does with given checkpoints.

For each ``--model`` (run one after another in this process, with the worker's own engine
settings, ``settings.build_settings``, and the same KV budget), it records: greedy tokens for
``--prompt`` token-id lists (with each position's two likeliest tokens and log-probs, ``top2``),
the KV capacity vLLM allocated (blocks x block size = tokens), and how many tokens of a
``--prefill-len``-token prompt reached layers < l and >= l (``tokens_head`` / ``tokens_tail``,
read from the model through ``LLM.apply_model``; with SwiftKV's fast prefill only the logits
token reaches the later layers), vLLM's compilation and CUDA-graph mode, the model runner it
picked and the CUDA graphs its workers captured (``compat.compilation_counters``).
``--also-eager`` loads each model a second time with ``enforce_eager`` (no compilation, no
graphs) and records its tokens (``eager_tokens``); ``--eager-model`` probes a model with
``enforce_eager`` only, after the ``--model`` ones (one process for a compiled model and eager
ones). ``--in-process`` runs vLLM's engine core (and,
with one rank, the model) in this process. With ``--compare`` it
also runs the reference engine (and, for ZACK checkpoints, the pure-torch reference of
``reference.zack_greedy``) and reports parity: the same greedy tokens, and the reference's
log-probs of vLLM's tokens (``reference_logprobs``, teacher-forced) with the largest gap to vLLM's
own (``reference_logprob_gap``: near-ties cannot hide a difference or fake one). ``quantization``:
the checkpoint's method as vLLM read it (``compressed-tensors`` for ``modelkit quantize``'s W8A8), or
the online one ``--quantization`` asks for (``fp8``: vLLM quantizes a 16-bit checkpoint's linear
weights to FP8 at load, on GPUs); ``quantized`` (one rank): every quantized layer's error against
the checkpoint's dequantized (or, online, its own 16-bit) weights (``quant_check``). Prints and
writes JSON; with ``--out`` the file is rewritten after every model, so a run stopped part-way
keeps what it measured.

Parity against a ZACK checkpoint directory, for example:
  .venv-vllm/bin/python -m swiftserve_vllm.probe --model /path/to/zack-dir --compare \
      [--ref-kv-methods '{"zack": {...}}']    # however the reference engine is told to use ZACK
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys

DEFAULT_PROMPTS = [[1, 504, 3575, 282, 4649, 314], [1, 9690, 198, 2683, 359, 253, 5356, 11173, 30, 2]]


def probe_model(model_dir: str, prompts: list[list[int]], max_tokens: int, prefill_len: int,
                kv_gb: float, max_model_len: int, eager: bool | None = None, tp: int = 1, pp: int = 1,
                kv_cache_dtype: str = "auto", dtype: str = "auto", gpu_share: float | None = None,
                speculative: dict | None = None, quantization: str | None = None) -> dict:
    from refengine.config import EngineConfig
    from swiftserve_vllm import compat as V
    from swiftserve_vllm.settings import VllmOptions, build_settings

    device = V.platform_device()
    settings = build_settings(EngineConfig(model=model_dir, max_model_len=max_model_len, kv_cache_memory_gb=kv_gb,
                                           max_num_seqs=16, kv_cache_dtype=kv_cache_dtype, dtype=dtype),
                              VllmOptions(enforce_eager=eager, tensor_parallel_size=tp, pipeline_parallel_size=pp,
                                          gpu_memory_utilization=gpu_share, speculative_config=speculative),
                              device)
    os.environ.update(settings.env)
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"     # apply_model pickles a function
    from swiftserve_vllm.model import token_counters

    drop = ("served_model_name",) if speculative else ("served_model_name", "disable_log_stats")   # stats: spec counts
    kwargs = {k: v for k, v in settings.engine_kwargs.items() if k not in drop}
    # The same KV budget on every platform (on a GPU the worker's default is a share of its memory):
    # capacities compare across models, and no engine takes the card for a small model.
    kwargs.setdefault("kv_cache_memory_bytes", int(kv_gb * 2 ** 30))
    if quantization:                  # vLLM's online method on a 16-bit checkpoint (``fp8``: FP8 weights on a GPU)
        kwargs["quantization"] = quantization
    llm = V.LLM(**kwargs)
    try:
        cc = llm.llm_engine.vllm_config.cache_config
        greedy = V.SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=2)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy, use_tqdm=False)
        before = _counters(llm.apply_model(token_counters))
        long_prompt = [(i * 7919) % 40000 + 100 for i in range(prefill_len)]
        llm.generate([{"prompt_token_ids": long_prompt}], V.SamplingParams(max_tokens=1, temperature=0.0),
                     use_tqdm=False)
        after = _counters(llm.apply_model(token_counters))
        spec = {m.name: m.value for m in llm.get_metrics() if m.name.startswith("vllm:spec_decode_num")
                and hasattr(m, "value")} if speculative else None
        lay = settings.layout
        vc = llm.llm_engine.vllm_config
        quant = None
        if vc.model_config.quantization and tp == 1 and pp == 1:
            from swiftserve_vllm.quant_check import summary

            quant = llm.apply_model(summary)[0]
        return {"model": model_dir, "device": device, "dtype": kwargs["dtype"], "enforce_eager": kwargs["enforce_eager"],
                "compilation_mode": _name(getattr(vc.compilation_config, "mode", None)),
                "cudagraph_mode": _name(getattr(vc.compilation_config, "cudagraph_mode", None)),
                "model_runner": "v2" if V.uses_v2_model_runner(vc) else "v1",
                "graphs": llm.apply_model(V.compilation_counters)[0],
                "tensor_parallel_size": tp, "pipeline_parallel_size": pp, "kv_cache_dtype": kv_cache_dtype,
                "quantization": vc.model_config.quantization, "quantized": quant,
                "tokens": [list(o.outputs[0].token_ids) for o in outs], "top2": [_top2(o) for o in outs],
                "num_blocks": int(cc.num_gpu_blocks), "block_size": int(cc.block_size),
                "kv_capacity_tokens": int(cc.num_gpu_blocks) * int(cc.block_size),
                "kv_cache_layers": lay.num_cache_owners, "swiftkv": lay.swiftkv, "zack_rank": lay.zack_rank,
                "zack_ranks": list(lay.zack_ranks) if lay.zack else None,
                "speculative_config": speculative, "spec_decode": spec,
                "prefill_len": prefill_len, "tokens_head": after[0] - before[0],
                "tokens_tail": after[1] - before[1] if before[1] >= 0 else None}
    finally:
        del llm
        gc.collect()


def _top2(output) -> list[list[list]]:
    """Per generated position, the two likeliest tokens and their log-probs ``[[id, lp], [id, lp]]``
    (what tells a near-tie, where two implementations may rightly pick different tokens)."""
    rows = []
    for pos in output.outputs[0].logprobs or []:
        best = sorted(((int(t), float(lp.logprob)) for t, lp in pos.items()), key=lambda x: -x[1])[:2]
        rows.append([list(b) for b in best])
    return rows


def _name(mode) -> str:
    """An enum setting of vLLM's config by name (``VLLM_COMPILE``, ``FULL_AND_PIECEWISE``)."""
    return str(getattr(mode, "name", mode))


def _counters(per_rank: list[tuple[int, int]]) -> tuple[int, int]:
    """(rows through the first rank's head, most rows through any rank's tail): every rank of a
    tensor-parallel group counts the same rows; with pipeline stages the tail may live on a later one."""
    return per_rank[0][0], max(t for _, t in per_rank)


# The reference engine's CPU kernels as torch ops (``--ref-kernels torch``): no C++ extension to build
# first (a GPU session's probes start at once, several in parallel).
TORCH_KERNELS = {"decode_kernel": "torch", "prefill_kernel": "torch", "fused_ops": "torch"}


def reference_engine(model_dir: str, kv_methods: dict | None = None, dtype: str = "float32", kernels: str = "auto"):
    """The reference engine on the CPU (SwiftKV as the checkpoint says; ``kv_methods`` as its
    ``--kv-methods``, e.g. how it is told to run a ZACK checkpoint's rotations; ``kernels`` "torch":
    torch ops instead of its C++ kernels)."""
    from refengine.config import EngineConfig
    from refengine.engine import LLMEngine

    return LLMEngine(EngineConfig(model=model_dir, dtype=dtype, device="cpu", max_model_len=1024,
                                  kv_cache_memory_gb=0.2, kv_methods=dict(kv_methods or {}),
                                  **(TORCH_KERNELS if kernels == "torch" else {})))


def reference_tokens(model_dir: str, prompts: list[list[int]], max_tokens: int,
                     kv_methods: dict | None = None, dtype: str = "float32", kernels: str = "auto",
                     engine=None) -> list[list[int]]:
    """Greedy tokens of the reference engine (``engine``, or one ``reference_engine`` builds)."""
    from refengine.sampling_params import SamplingParams

    eng = engine or reference_engine(model_dir, kv_methods, dtype, kernels)
    return eng.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0.0))


def reference_logprobs(engine, prompts: list[list[int]], tokens: list[list[int]]) -> list[list[float]]:
    """The reference engine's log-prob of each of ``tokens[i]`` after ``prompts[i]``, teacher-forced
    through its cache: both engines scored on the same sequence, so a near-tie that each engine
    rightly breaks its own way does not hide (or fake) a difference."""
    rows = engine.score([(p, t) for p, t in zip(prompts, tokens) if t])
    it = iter(rows)
    return [[lp for lp, *_ in next(it)] if t else [] for t in tokens]


def logprob_gap(top2: list[list[list]], ref: list[list[float]]) -> float:
    """Largest |vLLM's log-prob of its greedy token - the reference's log-prob of that token|."""
    return max((abs(pos[0][1] - r) for rows, refs in zip(top2, ref) for pos, r in zip(rows, refs)), default=0.0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m swiftserve_vllm.probe", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", action="append", default=[], help="model directory or shipped name (repeatable)")
    p.add_argument("--eager-model", action="append", default=[],
                   help="a model probed with enforce_eager whatever --enforce-eager says, after the --model ones "
                        "(repeatable): one probe process for a compiled model and eager ones")
    p.add_argument("--prompt", action="append", type=json.loads, help="prompt token ids as a JSON list (repeatable)")
    p.add_argument("--max-tokens", type=int, default=12)
    p.add_argument("--prefill-len", type=int, default=256)
    p.add_argument("--kv-gb", type=float, default=0.5, help="KV budget (GiB), the same for every model")
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--enforce-eager", dest="eager", action=argparse.BooleanOptionalAction, default=None,
                   help="vLLM without compilation (default: the worker's default on CPU)")
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--pipeline-parallel-size", type=int, default=1)
    p.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8_e4m3"])
    p.add_argument("--quantization", default=None, choices=["fp8"],
                   help="vLLM's online quantization of the checkpoint's linear weights (fp8: FP8 weights, GPUs)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="model dtype of vLLM and of the --compare reference engine (auto: the worker's default "
                        "for vLLM, i.e. float32 on CPU; the reference engine then runs float32)")
    p.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help="vLLM's share of the GPU memory (default: the worker's; small ones let several probes share "
                        "a GPU)")
    p.add_argument("--also-eager", action="store_true",
                   help="also load each model with enforce_eager (no compilation, no CUDA graphs): eager_tokens")
    p.add_argument("--speculative-config", type=json.loads, default=None,
                   help="vLLM's speculative config (JSON), as the worker's --speculative-config; the spec_decode "
                        "counters are recorded")
    p.add_argument("--in-process", action="store_true",
                   help="run vLLM's engine core in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0; one rank: its "
                        "model too) instead of the worker's engine-core and worker processes: the same model code, "
                        "two process starts fewer per model (~20 s on a 2-core CPU)")
    p.add_argument("--compare", action="store_true", help="also run the reference engine / torch reference")
    p.add_argument("--ref-kernels", choices=["auto", "torch"], default="auto",
                   help="the reference engine's CPU kernels (torch: no C++ extension build first)")
    p.add_argument("--ref-kv-methods", type=json.loads, default=None,
                   help="reference engine's KV methods as JSON (its --kv-methods), e.g. for its ZACK")
    p.add_argument("--out", default=None, help="write the JSON here too")
    args = p.parse_args(argv)
    if not args.model and not args.eager_model:
        p.error("give at least one --model or --eager-model")
    if args.in_process:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"     # vLLM reads it when each LLM is built
    from modelkit.models import resolve_model
    from swiftserve_vllm.layout import load_layout

    prompts = args.prompt or DEFAULT_PROMPTS
    results = []
    for name, eager in [(m, args.eager) for m in args.model] + [(m, True) for m in args.eager_model]:
        model_dir = str(resolve_model(name))
        run = dict(prompts=prompts, max_tokens=args.max_tokens, prefill_len=args.prefill_len, kv_gb=args.kv_gb,
                   max_model_len=args.max_model_len, tp=args.tensor_parallel_size, pp=args.pipeline_parallel_size,
                   kv_cache_dtype=args.kv_cache_dtype, dtype=args.dtype, gpu_share=args.gpu_memory_utilization,
                   speculative=args.speculative_config, quantization=args.quantization)
        r = probe_model(model_dir, eager=eager, **run)
        if args.also_eager:
            e = probe_model(model_dir, eager=True, **run)
            r.update(eager_tokens=e["tokens"], eager_tokens_head=e["tokens_head"], eager_tokens_tail=e["tokens_tail"])
        if args.compare:
            ref_dtype = r["dtype"] if r["dtype"] != "auto" else "float32"
            eng = reference_engine(model_dir, args.ref_kv_methods, ref_dtype, args.ref_kernels)
            r["reference_tokens"] = reference_tokens(model_dir, prompts, args.max_tokens, engine=eng)
            r["reference_parity"] = r["reference_tokens"] == r["tokens"]
            r["reference_logprobs"] = reference_logprobs(eng, prompts, r["tokens"])
            r["reference_logprob_gap"] = logprob_gap(r["top2"], r["reference_logprobs"])
            del eng
            if load_layout(model_dir).zack and not load_layout(model_dir).swiftkv:
                from swiftserve_vllm.reference import zack_greedy

                r["torch_reference_tokens"] = [zack_greedy(model_dir, pr, args.max_tokens) for pr in prompts]
                r["torch_reference_parity"] = r["torch_reference_tokens"] == r["tokens"]
        results.append(r)
        print(json.dumps(r), flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
