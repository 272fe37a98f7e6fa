"""EngineConfig: the one configuration object of a reference-engine process.

Built once at the entry point (worker CLI, benchmark, evaluator) and passed
explicitly. Values derived at run time (number of KV blocks, the model's spec)
live on the objects that derive them, not here.

``speculative_config`` is decoded the same way (``SpecConfig.parse``: vLLM's keys, ``SpecConfigError``).
``kv_methods`` is decoded where the config is built: a dict or JSON text becomes the
typed ``KVMethods`` in ``__post_init__`` (``MethodError`` on unknown names or bad
options). Checking it against the model, block size, KV dtype and SwiftKV is
``refengine.kv.registry.check_engine(config)``, the one check the worker CLI runs
before start and the engine runs as it plans its cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from refengine.kv.registry import KVMethods, default_block_size
from refengine.spec.config import SpecConfig


@dataclass
class EngineConfig:
    model: str                                  # HF-format directory (config.json + safetensors)
    device: str = "auto"                        # "auto" | "cpu" | "cuda" | "cuda:N"
    dtype: str = "auto"                         # "auto" (fp32 on CPU, bf16 on CUDA) | float32 | bfloat16 | float16
    seed: int = 0
    max_model_len: int | None = None            # None: min(config max_position_embeddings, 8192)
    block_size: int | None = None               # tokens per KV block; None: 16, or what a KV method prefers
                                                # (ZipCache: 32), ``registry.default_block_size``
    num_kv_blocks: int | None = None            # None: sized from kv_cache_memory_gb
    kv_cache_memory_gb: float = 1.0             # budget for the block pool
    kv_host_memory_gb: float | None = None      # bound on host-resident KV (KCache's V pool); None: unbounded
    max_num_seqs: int = 64                      # running requests at most
    max_num_batched_tokens: int = 2048          # token budget per step (chunked prefill)
    kv_cache_dtype: str = "auto"                # "auto" | "fp8_e4m3" (per-token scale, 1-byte storage)
    swiftkv: bool = True                        # use SwiftKV when the checkpoint has it; False = run as baseline
    torch_threads: int | None = None            # intra-op threads (CPU)
    kv_methods: KVMethods = field(default_factory=KVMethods)  # method name -> options (a dict is parsed)
    load_format: str = "auto"                   # "auto": safetensors in ``model``; "dummy": random weights (benchmarks);
                                                # "gguf": the one *.gguf in ``model``, quantized blocks kept (refengine.quant)
    enable_prefix_caching: bool = True          # share cached full prompt blocks (off when a KV method opts out)
    long_prefill_token_threshold: int | None = None  # most tokens of one request per step; None: budget // 2, 0: no cap
    packed_linear: str = "auto"                 # CPU fp32/bf16 GEMM weights in oneDNN's layout: "auto" | "off" | "lm_head" | "all"
    decode_kernel: str = "auto"                 # CPU decode attention: "auto" (C++ kernel when it builds) | "cpp" | "torch"
    prefill_kernel: str = "auto"                # CPU prefill attention (fp32/bf16): same choices as decode_kernel
    fused_ops: str = "auto"                     # CPU fp32 RMSNorm/RoPE/SiLU-mul/residual: same choices (refengine.fused_ops)
    malloc_tuning: bool = True                  # CPU: keep freed activations in glibc's heap (refengine.host_malloc)
    free_window_blocks: bool = True             # sliding-window layers keep block tables of their own and free what
                                                # their window left (False: one table, every block kept)
    # Speculative decoding (refengine.spec): vLLM's --speculative-config (JSON text or a dict is parsed);
    # None: off. Requests draft by default when set (SamplingParams.speculative=False opts one out).
    speculative_config: SpecConfig | None = None
    cuda_graphs: bool = True                    # CUDA: pure-decode steps replayed from CUDA graphs (refengine.graph_decode);
                                                # False: every step eager (the worker's --enforce-eager)
    huge_pages: bool = True                     # spawned engine process: glibc maps malloc memory for THP (refengine.host_malloc)

    def __post_init__(self) -> None:
        self.kv_methods = KVMethods.parse(self.kv_methods)
        self.speculative_config = SpecConfig.parse(self.speculative_config)
        if self.block_size is None:
            self.block_size = default_block_size(self.kv_methods)
