"""Linear layers of the reference engine: plain ``F.linear``, or prepacked weights on CPU.

Contract: ``make_linear(weight [out, in], bias [out] | None, packed)`` returns a module whose
``forward(x [..., in]) -> [..., out]`` equals ``F.linear(x, weight, bias)`` up to float
rounding. ``packed=True`` is honoured only where it is valid (CPU, float32 or bfloat16, the oneDNN
ops present in this torch build, and a self-check against ``F.linear`` passing);
otherwise the plain module is returned with the reason in its ``note``.

Why: on this project's CPUs (profiles in results/perf/profiles/) torch's default fp32
GEMM (MKL) is slow for the engine's skinny shapes: the LM head (in=576, out=49152 for
SmolLM2) at 8-64 rows takes 0.34-0.64x the time with the weight reordered once into
oneDNN's blocked layout, and so do the layers' projections at decode batch sizes. The
reordered weight replaces the plain one (no second copy), except when the LM head is
tied to the embedding, whose plain rows the embedding lookup still needs. In bfloat16 (oneDNN's
AVX-512-BF16 kernels, float32 accumulation) the reordered weight takes 0.28-0.65x of
``F.linear``'s time at decode row counts (1-64) and 0.82-0.98x at prefill's 1024
(``benchmarks/kernel/linear.py --dtype bfloat16``), because ``F.linear`` reorders the weight
again at every call.

In bfloat16 on CPUs with AVX-512-BF16, prepacked weights take the project's own GEMM instead
(``csrc/gemm_bf16.cpp``, ``Bf16Linear``): the weight blocked into 16 outputs x pairs of inputs,
which a decode step streams at ~2x oneDNN's rate at 1-8 rows (SmolLM2's layers: 0.5-0.7x its
time), at par from 512 rows on; and each output row is the same sum whatever the row count, so a
request's tokens do not depend on the rest of its batch (oneDNN's bf16 results do).

The engine's ``packed_linear`` setting ("auto" | "off" | "lm_head" | "all") is resolved here
(``resolve_packed_linear``) and checked after the model is built (``check_packed``).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from refengine.paged_kernel import build, named
from refengine.quant.plan import dense_parts, quant_layer

def _ops_available() -> str | None:
    """None when prepacking can be used in this process, else the reason it cannot."""
    if not torch.backends.mkldnn.is_available():
        return "torch was built without oneDNN"
    ops = torch.ops.mkldnn
    for name in ("_reorder_linear_weight", "_linear_pointwise"):
        if not hasattr(ops, name):
            return f"torch.ops.mkldnn.{name} missing in torch {torch.__version__}"
    return None


PACKABLE = (torch.float32, torch.bfloat16)
# Self-check tolerance per dtype: float32 differs from MKL's sums by a few ulp; bfloat16 results
# are rounded once from float32 sums in both, so a summation-order difference can flip an ulp (2^-8).
_CHECK_RTOL = {torch.float32: 1e-4, torch.bfloat16: 1.6e-2}


class Linear(nn.Module):
    """``F.linear`` with a frozen weight (the default everywhere but CPU float32 / bfloat16)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, note: str = ""):
        super().__init__()
        self.note = note                        # why a requested prepacking was not applied
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class PackedLinear(nn.Module):
    """The weight reordered once into oneDNN's blocked layout; inputs flattened to 2-D."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        # batch_size=None: a layout that does not assume a row count (decode and prefill share it).
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), None)
        self.packed = nn.Parameter(packed, requires_grad=False)
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        if x2.shape[0] == 0:
            return x.new_empty(*lead, self.out_features)
        y = torch.ops.mkldnn._linear_pointwise(x2.contiguous(), self.packed, self.bias, "none", [], "")
        return y.view(*lead, self.out_features)


@functools.cache
def bf16_gemm_kernels():
    """The CPU kernels' module when it has the bf16 GEMM (built with AVX-512-BF16), else None."""
    try:
        module = build().module
    except Exception:                         # no compiler: oneDNN's layout, as before
        return None
    return module if module.bf16_gemm_available() else None


PACK_UNIT = 4          # 16-output blocks per unit: csrc/gemm_bf16.cpp's NB


def pack_bf16(weight: torch.Tensor) -> torch.Tensor:
    """W [n, K] (K even) -> [ceil(n / 64), K / 2, 4, 16, 2]: element [u, p, j, i, t] =
    W[16 (4 u + j) + i, 2 p + t], zero rows past n (csrc/gemm_bf16.cpp's layout: a unit's four
    blocks of 16 outputs interleaved pair by pair, one stream per unit)."""
    n, k = weight.shape
    units = (n + 16 * PACK_UNIT - 1) // (16 * PACK_UNIT)
    padded = torch.zeros(units * PACK_UNIT * 16, k, dtype=weight.dtype)
    padded[:n] = weight
    return padded.view(units, PACK_UNIT, 16, k // 2, 2).permute(0, 3, 1, 2, 4).contiguous()


class Bf16Linear(nn.Module):
    """bfloat16 weight in ``pack_bf16``'s layout, multiplied by ``csrc/gemm_bf16.cpp``; inputs flattened to 2-D."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, kernels):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.k = kernels
        self.packed = nn.Parameter(pack_bf16(weight), requires_grad=False)
        # the bf16 bias held as float32 (exact): the kernel adds it to the float32 sums, no conversion per call
        self.bias = nn.Parameter(bias.to(weight.dtype).float(), requires_grad=False) if bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        with named("swiftserve::bf16_gemm"):
            y = self.k.bf16_gemm(x.reshape(-1, self.in_features).contiguous(), self.packed, self.out_features, self.bias)
        return y.view(*lead, self.out_features)


def _bf16_kernels_for(weight: torch.Tensor):
    if weight.dtype != torch.bfloat16 or weight.shape[1] % 2:
        return None
    return bf16_gemm_kernels()


def _self_check(mod: nn.Module, weight: torch.Tensor, bias: torch.Tensor | None) -> str | None:
    x = torch.randn(5, weight.shape[1], generator=torch.Generator().manual_seed(0), dtype=weight.dtype)
    ref = F.linear(x, weight, bias).float()
    got = mod(x).float()
    rtol = _CHECK_RTOL[weight.dtype]
    tol = rtol * max(1.0, float(ref.abs().max()))
    if got.shape != ref.shape or not torch.allclose(got, ref, rtol=rtol, atol=tol):
        return "prepacked output differs from F.linear"
    return None


def make_linear(weight, bias: torch.Tensor | None, packed: bool, plan=None) -> nn.Module:
    """``weight``: a matrix, or a list of matrices concatenated along the output dimension (fused
    q/k/v, gate/up). Quantized matrices (``refengine.quant``: GGUF blocks, W8A8 int8; ``plan`` the
    model's ``QuantPlan``) make a quantized layer; a mix of quantized and dense parts is served
    dense (the quantized parts dequantized)."""
    parts = list(weight) if isinstance(weight, (list, tuple)) else [weight]
    if not all(isinstance(p, torch.Tensor) for p in parts):
        layer = quant_layer(parts, bias, plan)
        if layer is not None:
            return layer
        parts = dense_parts(parts)
    weight = parts[0] if len(parts) == 1 else torch.cat(parts)
    if not packed:
        return Linear(weight, bias)
    why = None
    if weight.device.type != "cpu":
        why = f"device {weight.device.type}"
    elif weight.dtype not in PACKABLE:
        why = f"dtype {weight.dtype}"
    else:
        why = _ops_available()
    if why is None and (kernels := _bf16_kernels_for(weight)) is not None:
        mod = Bf16Linear(weight, bias, kernels)
        if _self_check(mod, weight, bias) is None:     # a failure would be a kernel bug: oneDNN's layout then
            return mod
    if why is None:
        try:
            mod = PackedLinear(weight, bias)
        except RuntimeError as exc:         # e.g. oneDNN's bf16 packing on a CPU without AVX-512 or AVX-NE-CONVERT
            why = f"oneDNN cannot prepack {weight.dtype} on this CPU: {str(exc).splitlines()[0]}"
        else:
            why = _self_check(mod, weight, bias)
            if why is None:
                return mod
    return Linear(weight, bias, note=why)


# "auto" on CPU float32 and bfloat16: which GEMMs take oneDNN-prepacked weights (the modules
# above), chosen from the side-by-side GEMM timings in results/perf/profiles/linear*.json.
AUTO_PACKED_LINEAR = "all"


def resolve_packed_linear(name: str, device: torch.device, dtype: torch.dtype) -> str:
    if name not in ("auto", "off", "lm_head", "all"):
        raise ValueError(f"packed_linear {name!r} not in ('auto', 'off', 'lm_head', 'all')")
    packable = device.type == "cpu" and dtype in PACKABLE
    if name == "auto":
        return AUTO_PACKED_LINEAR if packable else "off"
    if name != "off" and not packable:
        raise ValueError(f"packed_linear={name!r} needs CPU float32 or bfloat16 weights (here {device.type}/{dtype}); "
                         "use 'auto' or 'off'")
    return name


def check_packed(model: torch.nn.Module, requested: str) -> str:
    """One line for the start-up log; refuses an explicit request that could not be applied."""
    plain = [m.note for m in model.modules() if isinstance(m, Linear) and m.note]
    packed = sum(isinstance(m, PackedLinear) for m in model.modules())
    ours = sum(isinstance(m, Bf16Linear) for m in model.modules())
    if plain and requested in ("lm_head", "all"):
        raise RuntimeError(f"packed_linear={requested!r} could not be applied: {plain[0]}")
    kinds = [f"{n} {what}" for n, what in ((ours, "bf16-GEMM"), (packed, "oneDNN-prepacked")) if n] or ["0 prepacked"]
    return " + ".join(kinds) + " GEMM weights" + (f" (not packed: {plain[0]})" if plain else "")
