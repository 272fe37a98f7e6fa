"""The decoder layers of a pure-decode step in one C++ call, where the model and the cache allow it.

Contract:
  ``stack_for(model, kv) -> DecodeStackPath | None``: built once per (model, cache); None when
  anything of the model or the cache is outside what ``csrc/decode_stack.cpp`` does (then the
  layers run as Python modules, as always).
  ``DecodeStackPath.serves(h, attn) -> bool``: this step is pure decode (every sequence one
  query row, rows in sequence order, no window) and the batch carries the C++ decode kernel.
  ``DecodeStackPath.run(h, cos, sin, slots, attn) -> h``: layers ``0 .. num_kv_layers - 1``.

What it covers: a Llama-shaped layer (RMSNorm, fused q/k/v without bias, RoPE, GQA, SiLU-gated
MLP without bias; no QK-norm, sandwich norms or sliding windows) whose four linears are the
project's bf16 GEMM (``Bf16Linear``) or GGUF GEMM (``GGUFLinear``), with ``CppOps`` for the
element-wise ops, over a cache whose every slot is one plain dense part with the default
attention op (no KV method wraps, transforms or replaces anything; ZACK's narrower folded V
is fine: the V width is read from the pool). SwiftKV's earlier layers are covered; its later
ones stay in Python (``LlamaModel._swiftkv_tail``). Everything else takes the Python layers.

Invariant: the same kernels on the same operands in the same order as ``LlamaLayer.forward``,
so the two paths are bit-equal (tests/refengine/test_decode_stack.py). ``SWIFTSERVE_DECODE_STACK=0``
turns it off (swiftcommon.envs), for A/B measurements.
"""

from __future__ import annotations

import torch

from refengine.attention import AttnBatch, paged_attention
from refengine.fused_ops import CppOps
from refengine.kv.cache import HeadSplit, KVCache, SlotKV
from refengine.linear import Bf16Linear
from refengine.paged_kernel import named
from refengine.quant.qlinear import KERNEL_DTYPES, GGUFLinear
from swiftcommon import envs


class DecodeStackPath:
    def __init__(self, stack) -> None:
        self.stack = stack

    @staticmethod
    def serves(h: torch.Tensor, attn: AttnBatch) -> bool:
        d = attn.decode
        return (not attn.prefills and d is not None and attn.decode_kernel is not None and attn.window is None
                and d.rows == list(range(h.shape[0])))

    def run(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor,
            attn: AttnBatch) -> torch.Tensor:
        d = attn.decode
        with named("swiftserve::decode_stack"):
            return self.stack.run(h, cos, sin, slots, d.blocks, d.lens, d.starts)


def _plain_pools(slot, device: torch.device) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The slot's K and V pools when it is one plain dense part on ``device`` with the default attention, else None."""
    if type(slot) is not SlotKV or len(slot.parts) != 1 or slot.prefetch_next is not None:
        return None
    if not (isinstance(slot.transform, HeadSplit) and slot.transform.single) or slot.ops[0] is not paged_attention:
        return None
    pools = slot.parts[0].dense_pools()
    ok = pools is not None and pools[0].device == device and all(p.is_contiguous() for p in pools)
    return pools if ok else None


def _add_linear(stack, lin) -> bool:
    if type(lin) is Bf16Linear and lin.bias is None:
        stack.add_bf16_linear(lin.packed, lin.out_features)
        return True
    if type(lin) is GGUFLinear and lin.bias is None:
        stack.add_gguf_linear(*lin._call, lin.impl)
        return True
    return False


def stack_for(model, kv: KVCache) -> DecodeStackPath | None:
    """The C++ layer loop for ``model``'s first ``num_kv_layers`` layers over ``kv``, or None (see above)."""
    if not envs.decode_stack_enabled() or not isinstance(model.ops, CppOps):
        return None
    module = model.ops._m
    spec, n = model.spec, model.num_kv_layers
    if (not hasattr(module, "DecodeStack") or spec.qk_norm or spec.sandwich_norm or spec.hidden_act != "silu"
            or spec.qkv_bias or spec.mlp_bias or len(model.ropes) != 1 or n == 0):
        return None
    if any(m._forward_hooks or m._forward_pre_hooks for layer in model.layers[:n] for m in layer.modules()):
        return None                              # hooks watch the Python modules (modelkit.quantize)
    first = model.layers[0]
    dtype, device = first.ln1.dtype, first.ln1.device
    if device.type != "cpu" or dtype not in KERNEL_DTYPES or dtype != model.ropes[0].cos.dtype:
        return None
    nq, nk = first.qkv_split[0], first.qkv_split[1]
    stack = module.DecodeStack(nq, nk, spec.head_dim, float(first.scale), float(spec.rms_norm_eps))
    for i in range(n):
        layer, pools = model.layers[i], _plain_pools(kv.layers[i], device)
        if (spec.window(i) is not None or kv.layer_group[i] != 0 or layer.swiftkv_later
                or layer.qkv_split[:2] != [nq, nk] or layer.scale != first.scale or pools is None
                or layer.ln1.dtype != dtype or layer.ln2.dtype != dtype):
            return None
        if not all(_add_linear(stack, lin) for lin in (layer.qkv_proj, layer.o_proj, layer.gate_up, layer.down)):
            return None
        k_pool, v_pool = pools
        if k_pool.shape[3] != spec.head_dim or k_pool.shape[2] * spec.head_dim != nk or \
                layer.qkv_split[2] != v_pool.shape[2] * v_pool.shape[3]:
            return None
        stack.add_layer(layer.ln1, layer.ln2, k_pool, v_pool)
    return DecodeStackPath(stack)
