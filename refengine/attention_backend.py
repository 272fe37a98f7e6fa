"""The attention backend: one object, chosen once per engine, that names how a step's attention
is described and which kernels compute it (vLLM's ``AttentionBackend`` plays this role there).

An ``AttentionBackend`` holds
- its *metadata builder*, ``build_batch``: ``(cache_start, num_tokens, block_table)`` per
  sequence -> ``AttnBatch`` (``refengine.attention.build_attn_batch``; the batch carries the
  backend's kernels to every layer that reads it);
- its *kernels*: ``prefill_kernel`` and ``decode_kernel`` (``refengine.paged_kernel``, the C++
  CPU kernels that read the paged pools in place; on CUDA the decode kernel is
  ``refengine.triton_decode``'s) or None for gather + SDPA;
- its *paged op*, ``paged``: the attention op of one KV head part,
  ``[T, nq, k_dim] -> [T, nq, v_dim]`` (``refengine.attention.paged_attention``), which
  ``KVCache`` gives every part and KV methods may wrap (``KVMethod.wrap_attention``).

``select_backend`` is the one place the choice is made (``EngineConfig.decode_kernel`` /
``prefill_kernel``, the device). The one decision left to each call is the pools': a kernel
reads only dense pools of a float dtype it supports, and a part whose stores are not (FP8,
ZipCache, KCache's host V) is served by gather + SDPA with the same batch
(``refengine.attention``, ``_prefill_pools`` / ``_decode_pools``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from refengine.attention import AttnBatch, build_attn_batch, paged_attention
from refengine.paged_kernel import PagedDecodeKernel, resolve_decode_kernel, resolve_prefill_kernel


@dataclass(frozen=True)
class AttentionBackend:
    decode_kernel: PagedDecodeKernel | None = None     # None: gather + SDPA for decode rows
    prefill_kernel: PagedDecodeKernel | None = None    # None: gather + SDPA for prefill chunks

    def describe(self) -> str:
        def say(kernel) -> str:
            return getattr(kernel, "name", "C++ kernel") if kernel else "gather + SDPA"
        return f"decode attention: {say(self.decode_kernel)}, prefill attention: {say(self.prefill_kernel)}"

    def build_batch(self, chunks: list[tuple[int, int, list[int]]], block_size: int, device: torch.device,
                    seq_ids: list[str] | None = None, window: int | None = None) -> AttnBatch:
        """The step's attention metadata for one attention group (its ``window``), with this backend's kernels."""
        return build_attn_batch(chunks, block_size, device, seq_ids=seq_ids, decode_kernel=self.decode_kernel,
                                prefill_kernel=self.prefill_kernel, window=window)

    # The attention op of one head part (``refengine.kv.cache.PartKV``): (q [T, nq, k_dim], part,
    # batch, scale) -> [T, nq, v_dim]; each half of the step by this backend's kernel where the
    # part's pools allow it.
    paged = staticmethod(paged_attention)


def select_backend(decode: str, prefill: str, device: torch.device) -> AttentionBackend:
    """The engine's backend from its ``decode_kernel`` / ``prefill_kernel`` settings ("auto" | "cpp" |
    "torch"): the C++ kernels on CPU when they build ("cpp" refuses to start without them)."""
    return AttentionBackend(resolve_decode_kernel(decode, device), resolve_prefill_kernel(prefill, device))
