"""Paged attention in plain PyTorch (CPU and CUDA), over any ``KVLayerCache``.

The model runner describes a step once (``AttnBatch``); every layer reuses it.
Queries are the step's flattened tokens ``q [T, heads, head_dim]``.

- ``prefills``: sequences with several query tokens (chunked prefill). Each one
  gathers its keys ``0 .. start+n-1`` and runs SDPA with a causal mask offset by
  ``start`` (plain ``is_causal`` when the chunk starts at position 0).
- ``decode``: sequences with exactly one query token (decodes, and every
  sequence in SwiftKV's later layers). They are batched: keys are gathered into
  ``[B, max_len]`` padded rows with a boolean mask.

GQA runs through SDPA's ``enable_gqa`` (no repeat of K/V in memory).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class PrefillSeq:
    q_start: int
    q_end: int
    kv_idx: torch.Tensor                 # [ctx] flat cache indices of keys 0..ctx-1
    mask: torch.Tensor | None            # [n, ctx] bool (True = attend) or None for plain causal


@dataclass
class DecodeGroup:
    q_rows: torch.Tensor                 # [B] rows of q
    kv_idx: torch.Tensor                 # [B, max_len] flat cache indices (padding points at index 0)
    mask: torch.Tensor | None            # [B, 1, 1, max_len] bool, None when all lengths are equal
    lengths: list[int] = field(default_factory=list)


@dataclass
class AttnBatch:
    prefills: list[PrefillSeq]
    decode: DecodeGroup | None
    num_tokens: int


def _sdpa(q, k, v, mask, causal, scale):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True)


def paged_attention(q: torch.Tensor, cache, batch: AttnBatch, scale: float) -> torch.Tensor:
    out = None
    for p in batch.prefills:
        k, v = cache.gather(p.kv_idx)                           # [ctx, kvh, d]
        qi = q[p.q_start:p.q_end].transpose(0, 1).unsqueeze(0)  # [1, h, n, d]
        o = _sdpa(qi, k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0),
                  p.mask, p.mask is None, scale)
        if out is None:
            out = q.new_empty(q.shape[0], q.shape[1], v.shape[-1])
        out[p.q_start:p.q_end] = o[0].transpose(0, 1)
    d = batch.decode
    if d is not None:
        k, v = cache.gather(d.kv_idx)                           # [B, L, kvh, d]
        qd = q[d.q_rows].unsqueeze(2)                           # [B, h, 1, d]
        o = _sdpa(qd, k.transpose(1, 2), v.transpose(1, 2), d.mask, False, scale)
        if out is None:
            out = q.new_empty(q.shape[0], q.shape[1], v.shape[-1])
        out[d.q_rows] = o.squeeze(2)
    return out


def build_attn_batch(chunks: list[tuple[int, int, list[int]]], block_size: int, device: torch.device,
                     q_offsets: list[int] | None = None) -> AttnBatch:
    """Describe a step's attention from ``(start, num_tokens, block_table)`` per sequence.

    ``q_offsets[i]`` is the first row of sequence i in the flattened queries
    (default: cumulative ``num_tokens``). Sequences with one query join the decode group.
    """
    prefills: list[PrefillSeq] = []
    dec_rows: list[int] = []
    dec_tables: list[tuple[int, list[int]]] = []
    row = 0
    for i, (start, n, table) in enumerate(chunks):
        q0 = q_offsets[i] if q_offsets is not None else row
        row = q0 + n
        ctx = start + n
        if n == 1:
            dec_rows.append(q0)
            dec_tables.append((ctx, table))
            continue
        idx = _slots(table, ctx, block_size, device)
        mask = None
        if start > 0:
            qpos = torch.arange(start, ctx, device=device).unsqueeze(1)
            mask = torch.arange(ctx, device=device).unsqueeze(0) <= qpos
        prefills.append(PrefillSeq(q0, q0 + n, idx, mask))
    decode = None
    if dec_rows:
        lengths = [c for c, _ in dec_tables]
        max_len = max(lengths)
        idx = torch.zeros(len(dec_rows), max_len, dtype=torch.long, device=device)
        for b, (ctx, table) in enumerate(dec_tables):
            idx[b, :ctx] = _slots(table, ctx, block_size, device)
        mask = None
        if min(lengths) != max_len:
            lens = torch.tensor(lengths, device=device)
            mask = (torch.arange(max_len, device=device).unsqueeze(0) < lens.unsqueeze(1))[:, None, None, :]
        decode = DecodeGroup(torch.tensor(dec_rows, dtype=torch.long, device=device), idx, mask, lengths)
    return AttnBatch(prefills, decode, row)


def _slots(table: list[int], ctx: int, block_size: int, device: torch.device) -> torch.Tensor:
    """Flat cache indices of positions 0..ctx-1 for a block table."""
    nblocks = -(-ctx // block_size)
    blocks = torch.tensor(table[:nblocks], dtype=torch.long, device=device)
    idx = (blocks.unsqueeze(1) * block_size + torch.arange(block_size, device=device)).reshape(-1)
    return idx[:ctx]


def slot_mapping(chunks: list[tuple[int, int, list[int]]], block_size: int, device: torch.device) -> torch.Tensor:
    """Flat cache index of every new token of the step, in flattened order."""
    out = []
    for start, n, table in chunks:
        pos = torch.arange(start, start + n)
        blocks = torch.tensor(table, dtype=torch.long)[pos // block_size]
        out.append(blocks * block_size + pos % block_size)
    return torch.cat(out).to(device)
