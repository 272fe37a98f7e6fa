"""Paged decode attention for CUDA in Triton: K and V read in place from the block pools (issue 46).

Without it, a CUDA decode step gathers every sequence's blocks into a padded ``[B, L, kvh, d]``
copy and runs SDPA over it (``refengine.attention._decode_gathered``): the K/V bytes move twice,
and under CUDA graphs (``refengine.graph_decode``) L is the padded table width. This kernel reads
each sequence's blocks where they are, up to its own length, so a step reads the K/V it needs once.

``TritonDecodeKernel()(q [B, kvh, g, dk], k_pool [N, bs, kvh, dk], v_pool [N, bs, kvh, dv],
table [B, W], lens [B], scale, starts [B] | None) -> [B, kvh, g, dv]`` in q's dtype: the call of
the CPU kernel (``refengine.paged_kernel``), so ``refengine.attention`` serves both the same way.
One program per (sequence, KV head): its ``g`` query rows (GQA; padded to 16 for ``tl.dot``) against
the sequence's entries ``starts[b] .. lens[b]-1``, ``TILE`` entries (several blocks, each entry's
block id read from the table) a step, two ``tl.dot`` a step in float32 (scores, then probabilities
times V; IEEE products, no TF32) and an online softmax in float32 (running max, sum and output
rescaled per tile); any head widths (ZACK's ragged K/V widths included: the tiles are padded to
powers of two and masked). Grid and loop bounds come from tensors and shapes only, so a CUDA graph
can capture it. Dense float pools only (FP8 and the KV methods' stores keep gather +
SDPA, ``refengine.attention._decode_pools``).

On CUDA the engine takes it when triton imports and ``self_check`` agrees with ``reference`` (gather
and a float32 softmax) on a small random case (``resolve``; otherwise gather + SDPA, with a warning).
On CPU the tests run the same kernel in Triton's interpreter (``TRITON_INTERPRET=1``, set before this
module is imported).
"""

from __future__ import annotations

import logging

import torch
import triton
import triton.language as tl

log = logging.getLogger(__name__)


@triton.jit
def _decode_kernel(q_ptr, k_ptr, v_ptr, table_ptr, lens_ptr, starts_ptr, out_ptr, scale,
                   sq_b, sq_h, sq_g, sk_n, sk_t, sk_h, sv_n, sv_t, sv_h, st_b, so_b, so_h, so_g,
                   G, DK, DV,
                   BS: tl.constexpr, TILE: tl.constexpr, BG: tl.constexpr, BDK: tl.constexpr, BDV: tl.constexpr,
                   HAS_STARTS: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    length = tl.load(lens_ptr + b)
    first = 0
    if HAS_STARTS:
        first = tl.load(starts_ptr + b)
    g = tl.arange(0, BG)
    dk = tl.arange(0, BDK)
    dv = tl.arange(0, BDV)
    t = tl.arange(0, TILE)
    q = tl.load(q_ptr + b * sq_b + h * sq_h + g[:, None] * sq_g + dk[None, :],
                mask=(g < G)[:, None] & (dk < DK)[None, :], other=0.0).to(tl.float32)   # [BG, BDK]
    m_i = tl.full([BG], float("-inf"), tl.float32)
    l_i = tl.full([BG], 0.0, tl.float32)
    acc = tl.full([BG, BDV], 0.0, tl.float32)
    # TILE entries per step (several blocks: each entry's block id read from the table), so a sequence
    # takes length / TILE dependent steps, not length / BS
    for j in range(first // TILE, tl.cdiv(length, TILE)):
        pos = j * TILE + t
        valid = (pos < length) & (pos >= first)                          # [TILE]; some entry of every tile visited
        blk = tl.load(table_ptr + b * st_b + pos // BS, mask=valid, other=0).to(tl.int64)
        slot = pos % BS
        k = tl.load(k_ptr + (blk * sk_n + slot * sk_t + h * sk_h)[:, None] + dk[None, :],
                    mask=valid[:, None] & (dk < DK)[None, :], other=0.0)                     # [TILE, BDK]
        s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee") * scale           # [BG, TILE]
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + (blk * sv_n + slot * sv_t + h * sv_h)[:, None] + dv[None, :],
                    mask=valid[:, None] & (dv < DV)[None, :], other=0.0)                     # [TILE, BDV]
        # float32 operands (probabilities not rounded to the pools' bf16 as FlashAttention does): the
        # CPU kernel's numbers; float32 products use no tensor cores, a small share of a memory-bound
        # step (and Triton's interpreter, which tests this on CPU, multiplies bf16 tiles wrongly)
        acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(out_ptr + b * so_b + h * so_h + g[:, None] * so_g + dv[None, :], out,
             mask=(g < G)[:, None] & (dv < DV)[None, :])


TILE = 64                  # cache entries per step of the loop (a power of two; any block size)


def _pow2(n: int) -> int:
    """A tile size for n (tl.dot takes no dimension under 16)."""
    return max(16, triton.next_power_of_2(n))


class TritonDecodeKernel:
    name = "Triton kernel"

    def __call__(self, q, k_pool, v_pool, table, lens, scale: float, starts=None) -> torch.Tensor:
        B, kvh, G, DK = q.shape
        BS, DV = k_pool.shape[1], v_pool.shape[-1]
        q = q.contiguous()
        out = torch.empty(B, kvh, G, DV, dtype=torch.float32, device=q.device)
        if B == 0:
            return out.to(q.dtype)
        table = table.contiguous()
        _decode_kernel[(B, kvh)](
            q, k_pool, v_pool, table, lens, starts if starts is not None else lens, out, float(scale),
            q.stride(0), q.stride(1), q.stride(2), k_pool.stride(0), k_pool.stride(1), k_pool.stride(2),
            v_pool.stride(0), v_pool.stride(1), v_pool.stride(2), table.stride(0),
            out.stride(0), out.stride(1), out.stride(2), G, DK, DV,
            BS=BS, TILE=TILE, BG=_pow2(G), BDK=_pow2(DK), BDV=_pow2(DV), HAS_STARTS=starts is not None)
        return out.to(q.dtype)


def reference(q, k_pool, v_pool, table, lens, scale: float, starts=None) -> torch.Tensor:
    """The same attention by gathering each sequence's entries and a float32 softmax (tests, self-check)."""
    B, kvh, G, _ = q.shape
    bs = k_pool.shape[1]
    out = torch.empty(B, kvh, G, v_pool.shape[-1], dtype=torch.float32, device=q.device)
    for b in range(B):
        n, lo = int(lens[b]), int(starts[b]) if starts is not None else 0
        blocks = table[b, :-(-n // bs)]
        k = k_pool[blocks].flatten(0, 1)[lo:n].float()                   # [n - lo, kvh, dk]
        v = v_pool[blocks].flatten(0, 1)[lo:n].float()
        s = torch.einsum("hgd,thd->hgt", q[b].float(), k) * scale
        out[b] = torch.einsum("hgt,thd->hgd", s.softmax(-1), v)
    return out.to(q.dtype)


def self_check(device: torch.device) -> str | None:
    """Why the kernel cannot serve on ``device`` (it fails to compile or disagrees with ``reference``), or None."""
    try:
        gen = torch.Generator(device="cpu").manual_seed(0)
        k = torch.randn(6, 16, 2, 64, generator=gen).to(device)
        v = torch.randn(6, 16, 2, 48, generator=gen).to(device)
        q = torch.randn(2, 2, 3, 64, generator=gen).to(device)
        table = torch.tensor([[4, 1, 0], [2, 5, 3]], device=device)
        lens = torch.tensor([37, 20], device=device)
        got = TritonDecodeKernel()(q, k, v, table, lens, 0.125)
        want = reference(q, k, v, table, lens, 0.125)
        err = float((got - want).abs().max())
        return None if err < 1e-3 else f"differs from the reference by {err:.3g}"
    except Exception as exc:                       # a compiler or driver that cannot run it: say why
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def resolve(device: torch.device) -> TritonDecodeKernel | None:
    """The kernel for CUDA decode attention, or None (gather + SDPA) with the reason logged."""
    why = self_check(device)
    if why is not None:
        log.warning("Triton decode attention not used (%s); decode attention on %s: gather + SDPA", why, device)
        return None
    return TritonDecodeKernel()
