"""GGUF block formats served natively (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K): layouts, reference
dequantization and quantization, in torch (CPU or CUDA, no extension needed).

A quantized matrix is stored as GGUF stores it: ``raw [rows, row_bytes]`` uint8, each row the
blocks of one output channel along the input dimension (``cols`` values per row, a multiple of the
block size). ``dequantize(qtype, raw, cols)`` returns ``[rows, cols]`` float32 **bit-equal to
llama.cpp's reference dequantization** (``dequantize_row_*`` in ggml-quants.c): the same float32
operations in the same order, never fused (torch runs ``a * b`` and ``- c`` as separate kernels).
The C++ kernels (``csrc/quant_gguf.cpp``) are tested against these functions.

Block layouts (little-endian, fp16 scales as in ggml-common.h):
  Q4_0  32 values / 18 bytes: d fp16, qs[16] (low nibbles = values 0..15, high = 16..31); x = (q - 8) * d
  Q4_1  32 / 20: d fp16, m fp16, qs[16]; x = q * d + m
  Q5_0  32 / 22: d fp16, qh u32 (bit j = the 5th bit of value j), qs[16] (the low 4 bits, as Q4_0's);
        x = (q - 16) * d with q in 0..31
  Q8_0  32 / 34: d fp16, qs[32] int8; x = q * d
  Q4_K  256 / 144: d fp16, dmin fp16, scales[12] (eight 6-bit scales and mins), qs[128]: sub-block
        pairs (2j, 2j+1) share qs[32j:32j+32], low nibbles 2j, high 2j+1; x = (d*sc) * q - (dmin*m)
  Q6_K  256 / 210: ql[128], qh[64], scales[16] int8, d fp16; two halves of 128: value 32g + l of a
        half is the 4 bits of ql (l or l+32, low or high nibble) and 2 bits of qh[l], minus 32;
        x = (d * sc) * q with sc the scale of its 16 values
The quantizers follow llama.cpp's reference (round-to-nearest) ones for Q4_0 / Q4_1 / Q5_0 / Q8_0; Q4_K and
Q6_K get a plain round-to-nearest quantizer of our own (valid blocks, without llama.cpp's search), used
for SwiftKV's extra projections of a K-quant model and in tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Format:
    name: str
    ggml_type: int          # GGMLQuantizationType value in a GGUF file
    block: int              # values per block
    block_bytes: int


FORMATS = {f.name: f for f in (
    Format("Q4_0", 2, 32, 18), Format("Q4_1", 3, 32, 20), Format("Q5_0", 6, 32, 22), Format("Q8_0", 8, 32, 34),
    Format("Q4_K", 12, 256, 144), Format("Q6_K", 14, 256, 210))}
BY_GGML_TYPE = {f.ggml_type: f for f in FORMATS.values()}


def row_bytes(qtype: str, cols: int) -> int:
    f = FORMATS[qtype]
    if cols % f.block:
        raise ValueError(f"{qtype}: a row of {cols} values is not a whole number of {f.block}-value blocks")
    return cols // f.block * f.block_bytes


def _f16(b: torch.Tensor) -> torch.Tensor:
    """``[..., 2]`` uint8 (little-endian) -> float32 of the fp16 they hold (exact)."""
    return b.contiguous().view(torch.float16).squeeze(-1).float()


def _blocks(raw: torch.Tensor, qtype: str, cols: int) -> torch.Tensor:
    f = FORMATS[qtype]
    if raw.dtype != torch.uint8 or raw.dim() != 2 or raw.shape[1] != row_bytes(qtype, cols):
        raise ValueError(f"{qtype}: raw must be uint8 [rows, {row_bytes(qtype, cols)}] for {cols} columns, "
                         f"got {raw.dtype} {tuple(raw.shape)}")
    return raw.reshape(-1, f.block_bytes)


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """``qs [nb, 16]`` -> ``[nb, 32]`` int32 values: low nibbles first, then high nibbles."""
    q = qs.to(torch.int32)
    return torch.cat([q & 0xF, q >> 4], dim=1)


def k4_scales(sc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K ``scales [nb, 12]`` -> the 6-bit (scale, min) of the 8 sub-blocks, each ``[nb, 8]`` int32."""
    s = sc.to(torch.int32)
    lo_sc, lo_m = s[:, 0:4] & 63, s[:, 4:8] & 63
    hi_sc = (s[:, 8:12] & 0xF) | ((s[:, 0:4] >> 6) << 4)
    hi_m = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return torch.cat([lo_sc, hi_sc], 1), torch.cat([lo_m, hi_m], 1)


def _q6_values(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q6_K blocks ``[nb, 210]`` -> (q - 32 ``[nb, 256]`` int32, the scale of each value ``[nb, 256]`` int32)."""
    ql, qh = b[:, :128].to(torch.int32), b[:, 128:192].to(torch.int32)
    sc = b[:, 192:208].contiguous().view(torch.int8).to(torch.int32)
    vals, scales = [], []
    for h in range(2):
        lo, hi = ql[:, 64 * h:64 * h + 32], ql[:, 64 * h + 32:64 * h + 64]
        bits = qh[:, 32 * h:32 * h + 32]
        groups = [(lo & 0xF) | ((bits & 3) << 4), (hi & 0xF) | (((bits >> 2) & 3) << 4),
                  (lo >> 4) | (((bits >> 4) & 3) << 4), (hi >> 4) | (((bits >> 6) & 3) << 4)]
        for g, q in enumerate(groups):
            vals.append(q - 32)
            s = sc[:, 8 * h + 2 * g:8 * h + 2 * g + 2]                 # values 0..15 and 16..31 of the group
            scales.append(s.repeat_interleave(16, dim=1))
    return torch.cat(vals, 1), torch.cat(scales, 1)


def _q5_values(qh: torch.Tensor, qs: torch.Tensor) -> torch.Tensor:
    """Q5_0 ``qh [nb, 4]`` (a little-endian uint32, bit j the 5th bit of value j) and ``qs [nb, 16]`` ->
    the ``[nb, 32]`` int32 values 0..31."""
    h = qh.to(torch.int32)
    bits = (h.unsqueeze(2) >> torch.arange(8, dtype=torch.int32, device=qh.device)) & 1     # [nb, byte, bit]
    return _nibbles(qs) | (bits.reshape(-1, 32) << 4)


def dequantize(qtype: str, raw: torch.Tensor, cols: int) -> torch.Tensor:
    """``raw [rows, row_bytes]`` -> ``[rows, cols]`` float32, bit-equal to llama.cpp's ``dequantize_row_*``."""
    b = _blocks(raw, qtype, cols)
    rows = raw.shape[0]
    if qtype == "Q4_0":
        d = _f16(b[:, 0:2]).unsqueeze(1)
        y = (_nibbles(b[:, 2:18]) - 8).float() * d
    elif qtype == "Q4_1":
        d, m = _f16(b[:, 0:2]).unsqueeze(1), _f16(b[:, 2:4]).unsqueeze(1)
        y = _nibbles(b[:, 4:20]).float() * d + m
    elif qtype == "Q5_0":
        d = _f16(b[:, 0:2]).unsqueeze(1)
        y = (_q5_values(b[:, 2:6], b[:, 6:22]) - 16).float() * d
    elif qtype == "Q8_0":
        d = _f16(b[:, 0:2]).unsqueeze(1)
        y = b[:, 2:34].contiguous().view(torch.int8).float() * d
    elif qtype == "Q4_K":
        d, dmin = _f16(b[:, 0:2]).unsqueeze(1), _f16(b[:, 2:4]).unsqueeze(1)
        sc, m = k4_scales(b[:, 4:16])
        d1 = (d * sc.float()).repeat_interleave(32, dim=1)              # d * sc, rounded once, per sub-block
        m1 = (dmin * m.float()).repeat_interleave(32, dim=1)
        qs = b[:, 16:144].to(torch.int32).reshape(-1, 4, 32)
        q = torch.stack([qs & 0xF, qs >> 4], dim=2).reshape(-1, 256)     # sub-blocks 2j (low), 2j+1 (high)
        y = d1 * q.float() - m1
    elif qtype == "Q6_K":
        d = _f16(b[:, 208:210]).unsqueeze(1)
        q, sc = _q6_values(b)
        y = (d * sc.float()) * q.float()
    else:
        raise ValueError(f"unsupported format {qtype!r}; supported: {sorted(FORMATS)}")
    return y.reshape(rows, cols)


# ---------------------------------------------------------------------------------------------
# Quantizers


def _round_away(x: torch.Tensor) -> torch.Tensor:
    """C's roundf: halves away from zero (torch.round rounds halves to even)."""
    return torch.sign(x) * torch.floor(x.abs() + 0.5)


def _f16_bytes(x: torch.Tensor) -> torch.Tensor:
    """float32 ``[n]`` -> ``[n, 2]`` uint8 of its fp16 (round to nearest even, as GGML_FP32_TO_FP16)."""
    return x.to(torch.float16).contiguous().view(torch.uint8).reshape(-1, 2)


def _pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """``[nb, 32]`` values 0..15 -> ``[nb, 16]`` bytes (value j low nibble, value j + 16 high)."""
    q = q.to(torch.uint8)
    return q[:, :16] | (q[:, 16:] << 4)


def _safe_inv(d: torch.Tensor) -> torch.Tensor:
    return torch.where(d != 0, 1.0 / torch.where(d != 0, d, torch.ones_like(d)), torch.zeros_like(d))


def quantize(qtype: str, w: torch.Tensor) -> torch.Tensor:
    """float ``[rows, cols]`` -> ``raw [rows, row_bytes]`` uint8 in ``qtype``."""
    rows, cols = w.shape
    f = FORMATS[qtype]
    row_bytes(qtype, cols)
    x = w.detach().float().reshape(-1, f.block)
    if qtype == "Q8_0":
        amax = x.abs().amax(1)
        d = amax / 127
        q = _round_away(x * _safe_inv(d).unsqueeze(1)).to(torch.int8)
        out = torch.cat([_f16_bytes(d), q.view(torch.uint8)], 1)
    elif qtype == "Q4_0":
        idx = x.abs().argmax(1, keepdim=True)                      # the value of largest magnitude, signed
        mx = x.gather(1, idx).squeeze(1)
        d = mx / -8
        q = torch.clamp(torch.trunc(x * _safe_inv(d).unsqueeze(1) + 8.5), max=15)
        out = torch.cat([_f16_bytes(d), _pack_nibbles(q)], 1)
    elif qtype == "Q5_0":
        idx = x.abs().argmax(1, keepdim=True)
        mx = x.gather(1, idx).squeeze(1)
        d = mx / -16
        q = torch.clamp(torch.trunc(x * _safe_inv(d).unsqueeze(1) + 16.5), max=31).to(torch.int32)
        weights = 1 << torch.arange(8, dtype=torch.int32, device=x.device)       # bit j of byte k: value 8 k + j
        qh = ((q >> 4).reshape(-1, 4, 8) * weights).sum(2).to(torch.uint8)
        out = torch.cat([_f16_bytes(d), qh, _pack_nibbles(q & 0xF)], 1)
    elif qtype == "Q4_1":
        mn, mx = x.amin(1), x.amax(1)
        d = (mx - mn) / 15
        q = torch.clamp(torch.trunc((x - mn.unsqueeze(1)) * _safe_inv(d).unsqueeze(1) + 0.5), max=15)
        out = torch.cat([_f16_bytes(d), _f16_bytes(mn), _pack_nibbles(q)], 1)
    elif qtype == "Q4_K":
        out = _quantize_q4_k(x)
    elif qtype == "Q6_K":
        out = _quantize_q6_k(x)
    else:
        raise ValueError(f"unsupported format {qtype!r}; supported: {sorted(FORMATS)}")
    return out.reshape(rows, -1).contiguous()


def _quantize_q4_k(x: torch.Tensor) -> torch.Tensor:
    """Round-to-nearest Q4_K: per 32-value sub-block x ~ s * q - mn with q in 0..15, then the 8 scales
    and mins of a block quantized to 6 bits against their block maximum (d, dmin in fp16)."""
    sub = x.reshape(-1, 8, 32)
    mn = torch.clamp(sub.amin(2), max=0).neg()                      # mins >= 0, subtracted
    s = (sub.amax(2) + mn) / 15
    d = s.amax(1) / 63
    dmin = mn.amax(1) / 63
    d16, dmin16 = d.to(torch.float16).float(), dmin.to(torch.float16).float()
    sc = torch.clamp(_round_away(s * _safe_inv(d16).unsqueeze(1)), 0, 63)
    mq = torch.clamp(_round_away(mn * _safe_inv(dmin16).unsqueeze(1)), 0, 63)
    eff_s = (d16.unsqueeze(1) * sc).unsqueeze(2)                     # the scales the dequantizer will use
    eff_m = (dmin16.unsqueeze(1) * mq).unsqueeze(2)
    q = torch.clamp(_round_away((sub + eff_m) * _safe_inv(eff_s)), 0, 15).to(torch.int32)
    sc, mq = sc.to(torch.int32), mq.to(torch.int32)
    scales = torch.empty(x.shape[0], 12, dtype=torch.int32)
    scales[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    scales[:, 4:8] = mq[:, 0:4] | ((mq[:, 4:8] >> 4) << 6)
    scales[:, 8:12] = (sc[:, 4:8] & 0xF) | ((mq[:, 4:8] & 0xF) << 4)
    qs = q.reshape(-1, 4, 2, 32)
    packed = (qs[:, :, 0] | (qs[:, :, 1] << 4)).reshape(-1, 128)
    return torch.cat([_f16_bytes(d), _f16_bytes(dmin), scales.to(torch.uint8), packed.to(torch.uint8)], 1)


def _quantize_q6_k(x: torch.Tensor) -> torch.Tensor:
    """Round-to-nearest Q6_K: per 16-value sub-block x ~ s * (q - 32) with q in 0..63 (the signed
    value of largest magnitude maps to -32), the 16 scales int8 against the block's largest."""
    sub = x.reshape(-1, 16, 16)
    idx = sub.abs().argmax(2, keepdim=True)
    s = sub.gather(2, idx).squeeze(2) / -32                           # signed sub-block scales
    amax_idx = s.abs().argmax(1, keepdim=True)
    d = s.gather(1, amax_idx).squeeze(1) / -128
    d16 = d.to(torch.float16).float()
    sc = torch.clamp(_round_away(s * _safe_inv(d16).unsqueeze(1)), -128, 127)
    eff = (d16.unsqueeze(1) * sc).unsqueeze(2)
    q = (torch.clamp(_round_away(sub * _safe_inv(eff)), -32, 31) + 32).to(torch.int32).reshape(-1, 2, 4, 32)
    ql = torch.cat([(q[:, :, 0] & 0xF) | ((q[:, :, 2] & 0xF) << 4),          # values l (low) and l+64 (high)
                    (q[:, :, 1] & 0xF) | ((q[:, :, 3] & 0xF) << 4)], 2)       # values l+32 and l+96
    qh = ((q[:, :, 0] >> 4) | ((q[:, :, 1] >> 4) << 2) | ((q[:, :, 2] >> 4) << 4) | ((q[:, :, 3] >> 4) << 6))
    return torch.cat([ql.reshape(-1, 128).to(torch.uint8), qh.reshape(-1, 64).to(torch.uint8),
                      sc.to(torch.int8).view(torch.uint8), _f16_bytes(d)], 1)
