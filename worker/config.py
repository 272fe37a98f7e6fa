"""WorkerConfig: the one configuration object of a worker process.

Built once at the entry point (``worker.cli``) and passed explicitly to
``worker.app.build_app`` and ``worker.backends.create_engine_client``. The engine's
own settings live in the nested ``EngineConfig`` (``engine_config.model`` is the
HF model directory; the tokenizer is loaded from the same directory unless
``tokenizer`` says otherwise). Values derived at run time (the engine's
``max_model_len``) are read from the engine, not stored here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from refengine.config import EngineConfig
from worker.limits import RequestLimits

ENGINE_KINDS = ("reference", "vllm")
ENGINE_CORES = ("process", "thread")
OVERLOAD_STATUSES = (429, 503)


@dataclass
class WorkerConfig:
    engine_config: EngineConfig
    host: str = "127.0.0.1"
    port: int = 8000
    # Names clients may send as "model"; the first is the one responses report.
    # Empty: the model directory's name.
    served_model_name: tuple[str, ...] = ()
    engine: str = "reference"
    engine_core: str = "process"                # reference engine: own process, or a thread of this one
    tokenizer: str | None = None                # None: engine_config.model
    # Generation requests (HTTP requests, not choices) in flight at most; 0 = unlimited.
    # Beyond it a request is refused at once with ``overload_status`` (429 or 503).
    max_concurrent_requests: int = 0
    overload_status: int = 429
    max_logprobs: int = 20                      # largest logprobs / top_logprobs accepted
    log_level: str = "info"                     # uvicorn's log level
    max_body_bytes: int = 8 * 1024 * 1024       # larger request bodies get 413
    max_choices_per_request: int = 256          # prompts x n of one request (each is an engine request)
    # A chat template sent in a request runs on the worker (sandboxed Jinja, but its
    # loops are not bounded): refused unless the operator trusts the clients.
    trust_request_chat_template: bool = False
    drain_timeout: float = 30.0                 # SIGTERM: seconds in-flight requests get to finish
    limits: RequestLimits = field(default_factory=RequestLimits)   # cheap request limits (worker.limits)
    # Seconds without progress from the engine (a step that never ends) before it counts as hung, hence
    # dead: the worker then exits for its supervisor to restart it (worker.shutdown). None: never.
    engine_step_timeout: float | None = 300.0
    extra: dict = field(default_factory=dict)   # free-form, reported by /version
    # --engine vllm only (None: the backend's default for the platform, see swiftserve_vllm/settings.py)
    vllm_enforce_eager: bool | None = None
    vllm_gpu_memory_utilization: float | None = None
    vllm_fast_prefill: bool | None = None       # SwiftKV's kv_sharing_fast_prefill (None: on)
    tensor_parallel_size: int = 1               # vLLM's; the reference engine runs on one device
    pipeline_parallel_size: int = 1
    dtype_note: str | None = None               # why --dtype auto became engine_config.dtype (logged at start-up)
    # --speculative-config as given (vLLM's JSON keys): the reference engine's is parsed into
    # engine_config.speculative_config; --engine vllm hands this to vLLM (swiftserve_vllm.settings).
    speculative_config: dict | None = None

    @property
    def speculative(self) -> bool:
        """The engine drafts for requests by default (a speculative config was given)."""
        return self.speculative_config is not None

    def __post_init__(self) -> None:
        if self.engine not in ENGINE_KINDS:
            raise ValueError(f"engine must be one of {ENGINE_KINDS}, got {self.engine!r}")
        if self.engine_core not in ENGINE_CORES:
            raise ValueError(f"engine_core must be one of {ENGINE_CORES}, got {self.engine_core!r}")
        if self.overload_status not in OVERLOAD_STATUSES:
            raise ValueError(f"overload_status must be one of {OVERLOAD_STATUSES}")
        if self.tensor_parallel_size < 1 or self.pipeline_parallel_size < 1:
            raise ValueError("tensor_parallel_size and pipeline_parallel_size must be >= 1")
        if self.engine == "reference" and (self.tensor_parallel_size, self.pipeline_parallel_size) != (1, 1):
            raise ValueError("tensor/pipeline parallelism needs --engine vllm (the reference engine runs on one device)")
        if self.max_concurrent_requests < 0:
            raise ValueError("max_concurrent_requests must be >= 0 (0 = unlimited)")
        if isinstance(self.served_model_name, str):
            self.served_model_name = (self.served_model_name,)
        self.served_model_name = tuple(self.served_model_name)

    @property
    def model_dir(self) -> str:
        return self.engine_config.model

    @property
    def tokenizer_path(self) -> str:
        return self.tokenizer or self.engine_config.model

    @property
    def model_names(self) -> tuple[str, ...]:
        """Accepted model names, first = the name responses carry."""
        if self.served_model_name:
            return self.served_model_name
        return (Path(self.engine_config.model).name or str(self.engine_config.model),)

    @property
    def model_name(self) -> str:
        return self.model_names[0]
