"""Element-wise ops of the Llama layer: plain torch, or the fused C++ kernels on CPU float32 / bfloat16.

``resolve_fused_ops(name, device)`` turns ``EngineConfig.fused_ops`` into the ops object the
model calls (same choices and build as ``refengine.paged_kernel``'s kernels: "auto" = the C++
ops on CPU when they build, else torch with a warning; "cpp" = the C++ ops or an error;
"torch" = torch). Contract of both:

- ``rms_norm(x [T, n], w, eps)``: transformers' LlamaRMSNorm (float32 statistics);
- ``add_rms_norm(h, r, w, eps) -> (h + r, rms_norm(h + r))``: the sum may be written into
  ``r``'s storage (the caller passes a fresh projection output and does not read it again);
- ``rope(x [T, heads, d], cos, sin)``: rotary embedding (neox layout), possibly in place on x;
- ``silu_mul(gu [T, 2m])``: ``silu(gu[:, :m]) * gu[:, m:]`` (under "auto" the C++ one only where the CPU
  has AVX-512: ``SILU_KERNEL_FLAG``); ``gelu_mul``: the same with tanh-approximated gelu (Gemma's
  GeGLU; torch in both).

The C++ ops take CPU float32 or bfloat16 rows with contiguous elements (every tensor of a call in
one dtype; in bf16 they round where torch's bf16 ops round, see csrc/fused_ops.cpp) and fall
back to torch for anything else (float16, CUDA, odd strides, mixed dtypes), so a model can
always call them. They carry no autograd:
inference only (distillation uses ``refengine.models.llama.rms_norm`` directly).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from refengine.paged_kernel import PREFILL_KERNEL_FLAG, _resolve, named
from refengine.rope import Rope

CHOICES = ("auto", "cpp", "torch")
# SiLU-mul's vectorised exp runs on 16-float vectors, one register on AVX-512. Built for AVX2 (GCC splits
# them) it measured 1.4x slower per call than torch's silu and multiply at 1 row and ~4x at 32-256 rows
# (one thread, 2-core Zen 3), so "auto" keeps torch's SiLU-mul on CPUs without AVX-512 (the other fused
# ops stay C++ there: they beat torch's at decode sizes). "cpp" forces the kernel on any CPU.
SILU_KERNEL_FLAG = PREFILL_KERNEL_FLAG


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
    """The C++ ops; ``cpp_silu`` False: SiLU-mul stays torch's (CPUs without AVX-512 under "auto")."""

    def __init__(self, module, cpp_silu: bool = True) -> None:
        self._m = module
        self.cpp_silu = cpp_silu
        self.name = "C++" if cpp_silu else "C++, SiLU-mul torch"

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
        if self.cpp_silu and _rows(gu):
            with named("swiftserve::silu_mul"):
                return self._m.silu_mul(gu)
        return TorchOps.silu_mul(gu)


TORCH_OPS = TorchOps()


def resolve_fused_ops(name: str, device: torch.device, flags: set[str] | None = None) -> TorchOps:
    """``flags``: the CPU's (/proc/cpuinfo's when None), for "auto"'s choice of SiLU-mul."""
    kernel = _resolve("fused_ops", name, device)
    if kernel is None:
        return TORCH_OPS
    if name == "cpp":
        return CppOps(kernel.module)
    from swiftcommon.cpu_dtype import cpu_flags

    return CppOps(kernel.module, cpp_silu=SILU_KERNEL_FLAG in (cpu_flags() if flags is None else flags))
