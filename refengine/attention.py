"""Paged attention in plain PyTorch (CPU and CUDA), over any ``KVLayerCache``.

The model runner describes a step once (``AttnBatch``); every layer reuses it.
Queries are the step's flattened tokens ``q [T, heads, head_dim]``.

- ``prefills``: sequences with several query tokens (chunked prefill). Each one
  gathers the blocks holding keys ``0 .. start+n-1`` and runs SDPA with a causal
  mask offset by ``start`` (plain ``is_causal`` when the chunk starts at 0). With a
  prefill kernel (``refengine.paged_kernel``, CPU), dense pools and float32/bf16 queries, the
  kernel reads the blocks in place instead (flash-style tiles: no gather, no score matrix), for
  any K and V head widths (ZACK's ragged per-head ranks included).
- ``decode``: sequences with exactly one query token (decodes, and every
  sequence in SwiftKV's later layers). They are batched: their blocks are gathered
  into ``[B, max_blocks * block_size]`` rows, positions past a sequence's length
  masked out. With a decode kernel (``refengine.paged_kernel``, CPU) and dense pools
  (``cache.dense_pools()``), the kernel reads the blocks in place instead: no gather.

GQA: prefills use SDPA's ``enable_gqa``; decodes fold each KV head's query heads
into query rows (no repeat of K/V in memory either way).

Sliding windows (``build_attn_batch(..., window=W)``): a query at cache index ``p`` sees keys
``p-W+1 .. p``. Only the blocks from the one holding the first key a sequence's queries see
are passed (earlier ones may have been freed: ``refengine.block_groups``), so offsets in
``PrefillSeq`` / ``DecodeGroup`` count from the first passed block (``k0``). The masks carry
the window's lower bound; the kernels take it as ``window`` (prefill) and ``starts`` (decode).

Lengths and offsets here are *cache* entries (``ScheduledChunk.cache_start``), which
differ from token positions once an eviction method dropped tokens; RoPE positions
never reach this module. Which kernels a batch carries is the engine's attention backend's
choice (``refengine.attention_backend``). ``seq_rows(batch)`` names each sequence's query rows (by
request id) for KV methods that observe queries (eviction scores, ZipCache probes).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class PrefillSeq:
    q_start: int
    q_end: int
    blocks: torch.Tensor                 # [nblk] block ids holding keys k0..k0+ctx-1
    ctx: int                             # keys from the first passed block to the last query's
    mask: torch.Tensor | None            # [n, ctx] bool (True = attend) or None for plain causal
    seq_id: str | None = None            # request id
    k0: int = 0                          # cache index of the first passed block's first key (windows)
    block_ids: tuple[int, ...] = ()      # ``blocks`` as host ints (KCache's prefetch reads them without a sync)


@dataclass
class DecodeGroup:
    q_rows: torch.Tensor                 # [B] rows of q
    blocks: torch.Tensor                 # [B, max_blocks] block ids (padding repeats block 0)
    mask: torch.Tensor | None            # [B, 1, 1, max_blocks*block_size] bool (broadcast over heads and
                                         # query rows); None if no padding
    lengths: list[int] = field(default_factory=list)
    seq_ids: list = field(default_factory=list)     # request id per row
    rows: list[int] = field(default_factory=list)   # q_rows as a list
    lens: torch.Tensor | None = None                 # [B] int64 lengths (the decode kernel's input)
    starts: torch.Tensor | None = None               # [B] int64 first key each row sees (window); None: 0


@dataclass
class AttnBatch:
    prefills: list[PrefillSeq]
    decode: DecodeGroup | None
    num_tokens: int
    decode_kernel: object | None = None  # refengine.paged_kernel.PagedDecodeKernel, or None: gather + SDPA
    prefill_kernel: object | None = None  # the same kernels' module for prefills, or None: gather + SDPA
    window: int | None = None            # sliding window of the layers reading this batch


def _sdpa(q, k, v, mask, causal, scale):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True)


def _prefill_pools(q: torch.Tensor, cache, batch: AttnBatch):
    """The dense pools when the prefill kernel can serve this step's prefills, else None."""
    if batch.prefill_kernel is None or not batch.prefills or q.dtype not in (torch.float32, torch.bfloat16):
        return None
    pools = cache.dense_pools()
    if pools is None or pools[0].dtype not in (torch.float32, torch.bfloat16):   # any K / V widths
        return None
    return pools


def _decode_pools(cache, batch: AttnBatch):
    """The dense pools when the decode kernel can serve this step's decode rows, else None."""
    return cache.dense_pools() if batch.decode_kernel is not None else None


def _prefill_in_place(q, pools, batch: AttnBatch, scale: float) -> torch.Tensor:
    """Every prefill chunk by the prefill kernel over ``[N, bs, kvh, d]`` pools (float32 softmax and sums;
    bf16 queries over bf16 pools are read as they are, for the kernel's bf16 dot products)."""
    out = torch.empty(q.shape[0], q.shape[1], pools[1].shape[-1])
    if q.dtype == torch.bfloat16 and pools[0].dtype == torch.bfloat16:
        qc = q if q.stride(2) == 1 and q.stride(1) == q.shape[2] else q.contiguous()
    else:
        qc = q.float().contiguous()
    for p in batch.prefills:
        batch.prefill_kernel.prefill(qc[p.q_start:p.q_end], pools[0], pools[1], p.blocks,
                                     p.ctx - (p.q_end - p.q_start), scale, out[p.q_start:p.q_end],
                                     batch.window or 0)
    return out.to(q.dtype)


def _prefill_gathered(q, cache, batch: AttnBatch, scale: float):
    """Every prefill chunk by SDPA over its gathered blocks (any store); None without prefills."""
    out = None
    for p in batch.prefills:
        k, v = cache.gather(p.blocks)                           # [nblk, bs, kvh, d]
        k = k.flatten(0, 1)[:p.ctx]                             # [ctx, kvh, d]
        v = v.flatten(0, 1)[:p.ctx]
        qi = q[p.q_start:p.q_end].transpose(0, 1).unsqueeze(0)  # [1, h, n, d]
        o = _sdpa(qi, k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0),
                  p.mask, p.mask is None, scale)
        if out is None:
            out = q.new_empty(q.shape[0], q.shape[1], v.shape[-1])
        out[p.q_start:p.q_end] = o[0].transpose(0, 1)
    return out


def _decode_in_place(q, pools, d: DecodeGroup, kernel, scale: float, out):
    """The decode rows by the decode kernel over ``[N, bs, kvh, d]`` pools."""
    B, kvh = d.blocks.shape[0], pools[0].shape[2]
    qd = q[d.q_rows].view(B, kvh, q.shape[1] // kvh, q.shape[2])
    o = kernel(qd, pools[0], pools[1], d.blocks, d.lens, scale, d.starts)    # [B, kvh, g, dv]
    if out is None:
        out = q.new_empty(q.shape[0], q.shape[1], pools[1].shape[-1])
    out[d.q_rows] = o.reshape(B, q.shape[1], -1)
    return out


def _decode_gathered(q, cache, d: DecodeGroup, scale: float, out):
    """The decode rows by SDPA over their gathered, padded blocks (any store)."""
    B = d.blocks.shape[0]
    k, v = cache.gather(d.blocks.reshape(-1))               # [B*maxblk, bs, kvh, d]
    k = k.view(B, -1, *k.shape[2:])                         # [B, L, kvh, d]
    v = v.view(B, -1, *v.shape[2:])
    # One query position per sequence, so the query heads sharing a KV head can be
    # laid out as that KV head's query *rows*: [B, kvh, group, d] against K/V
    # [B, kvh, L, d]. Plain SDPA then needs neither enable_gqa nor a K/V repeat
    # (on CPU in bf16 this is ~8x faster than enable_gqa). Head h uses KV head
    # h // group, as in HF's repeat_kv.
    kvh = k.shape[2]
    qd = q[d.q_rows].view(B, kvh, q.shape[1] // kvh, q.shape[2])       # [B, kvh, group, d]
    o = F.scaled_dot_product_attention(qd, k.transpose(1, 2), v.transpose(1, 2), attn_mask=d.mask,
                                       scale=scale)                    # [B, kvh, group, dv]
    if out is None:
        out = q.new_empty(q.shape[0], q.shape[1], v.shape[-1])
    out[d.q_rows] = o.reshape(B, q.shape[1], v.shape[-1])
    return out


def paged_attention(q: torch.Tensor, cache, batch: AttnBatch, scale: float) -> torch.Tensor:
    """``q [T, heads, k_dim]`` -> ``[T, heads, v_dim]`` over ``cache`` (one head part): each half of the
    step by the batch's kernel when the part's pools allow it, else by gather + SDPA."""
    pools = _prefill_pools(q, cache, batch)
    out = _prefill_in_place(q, pools, batch, scale) if pools is not None else _prefill_gathered(q, cache, batch, scale)
    d = batch.decode
    if d is not None:
        pools = _decode_pools(cache, batch)
        if pools is not None:
            out = _decode_in_place(q, pools, d, batch.decode_kernel, scale, out)
        else:
            out = _decode_gathered(q, cache, d, scale, out)
    return out


def seq_rows(batch: AttnBatch) -> list[tuple[str | None, int, int, int]]:
    """``(seq_id, first query row, number of rows, cache index of the first row)`` per sequence."""
    out = [(p.seq_id, p.q_start, p.q_end - p.q_start, p.k0 + p.ctx - (p.q_end - p.q_start)) for p in batch.prefills]
    d = batch.decode
    if d is not None:
        ids = d.seq_ids or [None] * len(d.rows)
        out += [(sid, r, 1, n - 1) for sid, r, n in zip(ids, d.rows, d.lengths)]
    return out


def build_attn_batch(chunks: list[tuple[int, int, list[int]]], block_size: int, device: torch.device,
                     q_offsets: list[int] | None = None, seq_ids: list[str] | None = None,
                     decode_kernel=None, prefill_kernel=None, window: int | None = None) -> AttnBatch:
    """Describe a step's attention from ``(cache_start, num_tokens, block_table)`` per sequence.

    ``q_offsets[i]`` is the first row of sequence i in the flattened queries
    (default: cumulative ``num_tokens``). Sequences with one query join the decode group.
    ``seq_ids`` (request ids) label the sequences for methods that observe queries.
    ``decode_kernel`` (``refengine.paged_kernel``) is used by the decode group over dense pools,
    ``prefill_kernel`` by the prefills. ``window``: the layers' sliding window (None: global).
    """
    prefills: list[PrefillSeq] = []
    dec_rows: list[int] = []
    dec_ids: list = []
    dec_tables: list[tuple[int, int, list[int]]] = []
    row = 0
    for i, (start, n, table) in enumerate(chunks):
        q0 = q_offsets[i] if q_offsets is not None else row
        sid = seq_ids[i] if seq_ids is not None else None
        row = q0 + n
        ctx = start + n
        # First block holding a key some query of the chunk sees (0 without a window).
        first = max(0, start - window + 1) // block_size if window else 0
        k0 = first * block_size
        if n == 1:
            dec_rows.append(q0)
            dec_ids.append(sid)
            dec_tables.append((ctx - k0, max(0, ctx - window) - k0 if window else 0,
                               table[first:-(-ctx // block_size)]))
            continue
        ids = tuple(table[first:-(-ctx // block_size)])
        blocks = torch.tensor(ids, dtype=torch.long, device=device)
        mask = None
        if start > 0 or window:
            qpos = torch.arange(start - k0, ctx - k0, device=device).unsqueeze(1)   # [n, 1] relative
            keys = torch.arange(ctx - k0, device=device).unsqueeze(0)              # [1, ctx - k0]
            mask = keys <= qpos
            if window:
                mask &= keys > qpos - window
        prefills.append(PrefillSeq(q0, q0 + n, blocks, ctx - k0, mask, sid, k0, ids))
    decode = None
    if dec_rows:
        lengths = [c for c, _, _ in dec_tables]
        max_blocks = -(-max(lengths) // block_size)
        blocks = torch.tensor([r + [0] * (max_blocks - len(r)) for _, _, r in dec_tables], dtype=torch.long,
                              device=device)
        lens = torch.tensor(lengths, dtype=torch.long, device=device)
        lows = [lo for _, lo, _ in dec_tables]
        starts = torch.tensor(lows, dtype=torch.long, device=device) if any(lows) else None
        mask = None
        if starts is not None or any(c != max_blocks * block_size for c in lengths):
            span = torch.arange(max_blocks * block_size, device=device).unsqueeze(0)
            mask = span < lens.unsqueeze(1)
            if starts is not None:
                mask &= span >= starts.unsqueeze(1)
            mask = mask[:, None, None, :]
        decode = DecodeGroup(torch.tensor(dec_rows, dtype=torch.long, device=device), blocks, mask, lengths,
                             dec_ids if seq_ids is not None else [], dec_rows, lens, starts)
    return AttnBatch(prefills, decode, row, decode_kernel, prefill_kernel, window)


def slot_mapping(chunks: list[tuple[int, int, list[int]]], block_size: int, device: torch.device) -> torch.Tensor:
    """Flat cache index of every new token of the step, in flattened order."""
    out = []
    for start, n, table in chunks:
        pos = torch.arange(start, start + n)
        blocks = torch.tensor(table, dtype=torch.long)[pos // block_size]
        out.append(blocks * block_size + pos % block_size)
    return torch.cat(out).to(device)
