"""Element-wise ops of the Llama layer: plain torch, or the fused C++ kernels on CPU float32 / bfloat16.

``resolve_fused_ops(name, device)`` turns ``EngineConfig.fused_ops`` into the ops object the
model calls (same choices and build as ``refengine.paged_kernel``'s kernels: "auto" = the C++
ops on CPU when they build, else torch with a warning; "cpp" = the C++ ops or an error;
"torch" = torch). Contract of both:

- ``rms_norm(x [T, n], w, eps)``: transformers' LlamaRMSNorm (float32 statistics);
- ``add_rms_norm(h, r, w, eps) -> (h + r, rms_norm(h + r))``: the sum may be written into
  ``r``'s storage (the caller passes a fresh projection output and does not read it again);
- ``rope(x [T, heads, d], cos, sin)``: rotary embedding (neox layout), possibly in place on x;
- ``silu_mul(gu [T, 2m])``: ``silu(gu[:, :m]) * gu[:, m:]``; ``gelu_mul``: the same with
  tanh-approximated gelu (Gemma's GeGLU; torch in both).

The C++ ops take CPU float32 or bfloat16 rows with contiguous elements (every tensor of a call in
one dtype; in bf16 they round where torch's bf16 ops round, see csrc/fused_ops.cpp) and fall
back to torch for anything else (float16, CUDA, odd strides, mixed dtypes), so a model can
always call them. They carry no autograd:
inference only (distillation uses ``refengine.models.llama.rms_norm`` directly).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from refengine.paged_kernel import _resolve, named
from refengine.rope import Rope

CHOICES = ("auto", "cpp", "torch")


def torch_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Same op order as transformers' LlamaRMSNorm (float32 statistics).
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


class TorchOps:
    name = "torch"

    rms_norm = staticmethod(torch_rms_norm)
    rope = staticmethod(Rope.apply)

    @staticmethod
    def add_rms_norm(h: torch.Tensor, r: torch.Tensor, weight: torch.Tensor, eps: float):
        s = h + r
        return s, torch_rms_norm(s, weight, eps)

    @staticmethod
    def silu_mul(gu: torch.Tensor) -> torch.Tensor:
        gate, up = gu.chunk(2, dim=-1)
        return F.silu(gate) * up

    @staticmethod
    def gelu_mul(gu: torch.Tensor) -> torch.Tensor:
        """GeGLU (Gemma): gelu with the tanh approximation of the gate, times up."""
        gate, up = gu.chunk(2, dim=-1)
        return F.gelu(gate, approximate="tanh") * up


FUSED_DTYPES = (torch.float32, torch.bfloat16)


def _rows(*xs: torch.Tensor) -> bool:
    """CPU float32 or bfloat16 [T, n] rows with contiguous elements, one dtype: what the C++ ops read."""
    return xs[0].dtype in FUSED_DTYPES and all(
        x.dtype == xs[0].dtype and x.device.type == "cpu" and x.dim() == 2 and x.stride(1) == 1 for x in xs)


class CppOps(TorchOps):
    name = "C++"

    def __init__(self, module) -> None:
        self._m = module

    def rms_norm(self, x, weight, eps):
        if _rows(x) and weight.dtype == x.dtype:
            with named("swiftserve::rms_norm"):
                return self._m.rms_norm(x, weight, float(eps))
        return torch_rms_norm(x, weight, eps)

    def add_rms_norm(self, h, r, weight, eps):
        if _rows(h, r) and weight.dtype == h.dtype and h.shape == r.shape:
            with named("swiftserve::add_rms_norm"):
                return r, self._m.add_rms_norm_(r, h, weight, float(eps))       # r += h, in place
        return TorchOps.add_rms_norm(h, r, weight, eps)

    def rope(self, x, cos, sin):
        if (x.dtype == cos.dtype == sin.dtype and x.dtype in FUSED_DTYPES and x.device.type == "cpu" and x.dim() == 3
                and x.stride(2) == 1 and x.stride(1) == x.shape[2]):
            with named("swiftserve::rope"):
                self._m.rope_(x, cos, sin)
            return x
        return Rope.apply(x, cos, sin)

    def silu_mul(self, gu):
        if _rows(gu):
            with named("swiftserve::silu_mul"):
                return self._m.silu_mul(gu)
        return TorchOps.silu_mul(gu)


TORCH_OPS = TorchOps()


def resolve_fused_ops(name: str, device: torch.device) -> TorchOps:
    kernel = _resolve("fused_ops", name, device)
    return TORCH_OPS if kernel is None else CppOps(kernel.module)
