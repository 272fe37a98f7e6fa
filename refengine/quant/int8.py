"""int8 W8A8: per-channel int8 weights, dynamic per-token int8 activations, integer GEMMs.

The checkpoint format is the one vLLM reads, compressed-tensors ``int-quantized``: config.json's
``quantization_config`` has ``quant_method: compressed-tensors`` and a config group whose weights
are ``{num_bits: 8, type: int, symmetric: true, strategy: channel}`` and whose input activations are
``{num_bits: 8, type: int, symmetric: true, dynamic: true, strategy: token}``; each quantized
linear layer ``X`` stores ``X.weight`` (int8 ``[out, in]``) and ``X.weight_scale`` (``[out, 1]``),
so that ``W = weight * weight_scale``. ``modelkit quantize`` writes such checkpoints.

``CompressedTensorsWeights(base, scheme)``: a weight source whose ``get_quant(name)`` is an
``Int8Weight`` for the quantized layers (``get`` dequantizes them, for load-time folds).
``Int8Linear``: ``forward(x)`` quantizes each row of x to int8 (scale = max|x| / qmax), runs
oneDNN's u8 x s8 GEMM (``torch.ops.onednn.qlinear_pointwise``: ``vpdpbusd`` on CPUs with
AVX512-VNNI or AVX-VNNI) with the weight's per-channel scales, then multiplies each row by its
scale. Exactness: CPUs without VNNI multiply u8 x s8 pairs into saturating int16 sums
(``vpmaddubsw``), which loses sums above 32767; there the activations use 7 bits (|q| <= 63, so
127 * 127 * 2 fits) and the integer products stay exact. ``Int8Kernels`` probes which applies once,
by comparing a GEMM of extreme values with the exact integer product.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import nn

from refengine.paged_kernel import named

log = logging.getLogger(__name__)


@dataclass
class Int8Weight:
    q: torch.Tensor            # int8 [out, in]
    scale: torch.Tensor        # float32 [out]

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (self.q.float() * self.scale.unsqueeze(1)).to(dtype)

    @staticmethod
    def quantize(w: torch.Tensor) -> "Int8Weight":
        """Symmetric per-output-channel int8 (scale = max|row| / 127, round to nearest)."""
        w = w.detach().float()
        scale = w.abs().amax(1).clamp_min(1e-12) / 127
        return Int8Weight(torch.clamp(torch.round(w / scale.unsqueeze(1)), -127, 127).to(torch.int8), scale)

    @staticmethod
    def cat(parts: list["Int8Weight"]) -> "Int8Weight":
        return Int8Weight(torch.cat([p.q for p in parts]), torch.cat([p.scale for p in parts]))


# ---------------------------------------------------------------------------------------------
# The checkpoint format


def w8a8_scheme(config: dict) -> dict | None:
    """The quantization config of a compressed-tensors W8A8 (int8, channel / dynamic token)
    checkpoint; None when config.json has no quantization_config; ValueError for any other scheme."""
    qc = config.get("quantization_config")
    if not qc:
        return None
    if qc.get("quant_method") != "compressed-tensors":
        raise ValueError(f"quantization_config.quant_method {qc.get('quant_method')!r} is not served by the reference "
                         "engine (served: compressed-tensors W8A8 int8; GGUF files with --load-format gguf)")
    if qc.get("format") not in ("int-quantized", "naive-quantized"):
        raise ValueError(f"compressed-tensors format {qc.get('format')!r} is not served (served: int-quantized)")
    groups = list((qc.get("config_groups") or {}).values())
    want_w = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"}
    want_a = {"num_bits": 8, "type": "int", "symmetric": True, "dynamic": True, "strategy": "token"}
    for g in groups:
        w, a = g.get("weights") or {}, g.get("input_activations") or {}
        for want, got, what in ((want_w, w, "weights"), (want_a, a, "input_activations")):
            bad = {k: got.get(k) for k, v in want.items() if got.get(k) != v}
            if bad:
                raise ValueError(f"compressed-tensors {what} {bad} not served: the reference engine runs W8A8 with "
                                 f"{what} {want}")
    if len(groups) != 1:
        raise ValueError(f"compressed-tensors: {len(groups)} config groups; one W8A8 group is served")
    return qc


class CompressedTensorsWeights:
    """A ``WeightSource`` over a W8A8 checkpoint: quantized layers as ``Int8Weight``."""

    def __init__(self, base) -> None:
        self.base = base

    def __contains__(self, name: str) -> bool:
        return name in self.base

    def names(self) -> list[str]:
        return self.base.names()

    def get_quant(self, name: str) -> Int8Weight | None:
        scale_name = name + "_scale"
        if not name.endswith(".weight") or scale_name not in self.base:
            return None
        q = self.base.get(name)
        if q.dtype != torch.int8:
            raise ValueError(f"{name}: compressed-tensors int8 weight stored as {q.dtype}")
        return Int8Weight(q, self.base.get(scale_name, torch.float32).reshape(-1))

    def stored_dense(self, name: str) -> bool:
        return name + "_scale" not in self.base          # the checkpoint left it unquantized (lm_head, norms)

    def get(self, name: str, dtype: torch.dtype | None = None, device="cpu") -> torch.Tensor:
        q = self.get_quant(name)
        t = q.dequantize() if q is not None else self.base.get(name)
        return (t.to(dtype) if dtype is not None else t).to(device)

    def close(self) -> None:
        self.base.close()


# ---------------------------------------------------------------------------------------------
# Kernels


def _vnni_flags() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((ln for ln in f if ln.startswith("flags")), "").split()
    except OSError:
        return False
    return "avx512_vnni" in flags or "avx_vnni" in flags or "amx_int8" in flags


_NO_BIAS = torch.empty(0)


def _cpp_kernels():
    """The C++ kernels' module when it builds and has the W8A8 activation ops, else None."""
    from refengine.paged_kernel import build

    try:
        module = build().module
    except Exception:                      # no compiler: the torch code, the same bits
        return None
    return module if hasattr(module, "int8_quant_rows") else None


class Int8Kernels:
    """oneDNN's int8 linear, with the activation range that keeps its sums exact on this CPU.
    The rows' quantization and the output's rescale run as the C++ kernels' ``int8_quant_rows`` /
    ``int8_rescale`` (one pass each, bit-equal to the torch code beside them) when they build."""

    def __init__(self, fused: bool = True) -> None:
        ops = torch.ops.onednn
        if not (hasattr(ops, "qlinear_prepack") and hasattr(ops, "qlinear_pointwise")):
            raise RuntimeError(f"torch {torch.__version__} has no oneDNN int8 linear (torch.ops.onednn.qlinear_*)")
        self.prepack, self.run = ops.qlinear_prepack, ops.qlinear_pointwise
        self.cpp = _cpp_kernels() if fused else None
        self.qmax = 127 if self._exact(127) else 63
        if self.qmax == 63:
            log.info("int8 GEMM: no VNNI (saturating u8 x s8 pairs): activations take 7 bits")

    def _exact(self, qmax: int) -> bool:
        """The GEMM of extreme values equals the exact integer product."""
        g = torch.Generator().manual_seed(0)
        K, N = 256, 32
        x = torch.randint(-qmax, qmax + 1, (4, K), generator=g)
        x[:, :64] = qmax
        w = torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int8)
        w[:, :64] = 127
        got = self.gemm(x.to(torch.float32), torch.ones(4), self.prepack(w, [4, K]), torch.ones(N), qmax)
        return torch.equal(got.double(), x.double() @ w.double().t())

    def gemm(self, xq: torch.Tensor, sx: torch.Tensor, packed: torch.Tensor, sw: torch.Tensor, qmax: int) -> torch.Tensor:
        """``xq [M, K]`` integer values (float) -> float32 ``[M, N]`` = (xq @ Wq^T) * sw * sx[:, None]."""
        zp = qmax + 1                                      # u8 = q + zp in [1, 2 * qmax + 1]
        return self.gemm_u8((xq + zp).to(torch.uint8), packed, sw, qmax).mul_(sx.unsqueeze(1))

    def gemm_u8(self, xu: torch.Tensor, packed: torch.Tensor, sw: torch.Tensor, qmax: int) -> torch.Tensor:
        """``xu [M, K]`` u8 (the values plus the zero point qmax + 1) -> float32 ``(xu - zp) @ Wq^T * sw``."""
        return self.run(xu, 1.0, qmax + 1, packed, sw, torch.zeros(sw.shape[0], dtype=torch.int64),
                        None, 1.0, 0, torch.float32, "none", [], "")

    def linear(self, x: torch.Tensor, packed: torch.Tensor, sw: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``x [M, K]`` -> ``[M, N]`` in x's dtype: quantize the rows, the int8 GEMM, rescale (+ ``bias``,
        float32)."""
        if self.cpp is None:
            xq, sx = self.quant_rows(x)
            y = self.gemm(xq, sx, packed, sw, self.qmax)
            if bias is not None:
                y += bias
            return y.to(x.dtype)
        xu, sx = self.cpp.int8_quant_rows(x.contiguous(), self.qmax)
        y = self.gemm_u8(xu, packed, sw, self.qmax)
        out = y if x.dtype == torch.float32 else torch.empty(y.shape, dtype=x.dtype)
        self.cpp.int8_rescale(y, sx, bias if bias is not None else _NO_BIAS, out)
        return out

    def quant_rows(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-row symmetric quantization: (integer values as float32 [M, K], scales [M])."""
        xf = x.float()
        s = xf.abs().amax(1).clamp_min(1e-12) / self.qmax
        return torch.round(xf / s.unsqueeze(1)).clamp_(-self.qmax, self.qmax), s


class Int8Linear(nn.Module):
    def __init__(self, w: Int8Weight, bias: torch.Tensor | None, kernels: Int8Kernels) -> None:
        super().__init__()
        self.k = kernels
        self.out_features, self.in_features = w.shape
        self.packed = nn.Parameter(kernels.prepack(w.q.contiguous(), [1, self.in_features]), requires_grad=False)
        self.register_buffer("scale", w.scale.float().contiguous(), persistent=False)
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None
        # float32 once here, not per call: what the rescale adds
        self.register_buffer("bias_f32", bias.float().contiguous() if bias is not None else None, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        if x2.shape[0] == 0:
            return x.new_empty(*lead, self.out_features)
        with named("swiftserve::int8_linear"):
            y = self.k.linear(x2, self.packed, self.scale, self.bias_f32)
        return y.view(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, W8A8 (activations {self.k.qmax * 2 + 1} levels)"
