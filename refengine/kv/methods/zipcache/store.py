"""ZipCache storage: packed 2/4/8/16-bit blocks plus a full-precision staging window.

Bit packing (``pack``/``unpack``): integer codes ``[..., dims]`` in ``[0, 2^bits)`` ->
``uint8 [..., ceil(dims * bits / 8)]``; with 2 and 4 bits, 8/bits codes per byte, the
first code in the lowest bits; 8 bits is one byte; 16 bits two bytes, low byte first.

``ZipState`` (one per engine, shared by every store) maps block ids to staging
entries: a block is *staged* (full precision, in every store's ``stage``) from the step
its first token is written until it leaves the window (``flush``), then *packed*.

``ZipStore`` (one per K or V of a head part), ``n`` heads of ``d`` channels, shapes:
  hi [blocks, n_hi, n, bytes_hi]   lo [blocks, bs - n_hi, n, bytes_lo]   slot_of [blocks, bs, n]
  (slot_of is the K store's; its V store holds the same tensor, so the map is stored once)
  K: cmin, crange [blocks, n, d]          value = cmin + u * crange
  V: cnorm [blocks, n, d]; tmin, trange [blocks, bs, n]   value = cnorm * (tmin + u * trange)
  u = code / (2^bits - 1) in [0, 1]; stage [S, bs, n, d] (compute dtype)
  K stores also hold the saliency of staged tokens: sal [S, bs, n] and cnt [S, bs]
``codes(blocks)`` returns u in token order with its metadata (staged blocks: their full
precision values with identity metadata), which attention folds into its products;
``gather(blocks)`` dequantises.
"""

from __future__ import annotations

import torch

from refengine.kv.methods.zipcache.layout import ZipLayout

_SHIFTS = {2: (0, 2, 4, 6), 4: (0, 4)}


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    d = codes.shape[-1]
    c = codes.to(torch.int32)
    if bits == 16:
        return torch.stack([c & 255, c >> 8], dim=-1).flatten(-2).to(torch.uint8)
    if bits == 8:
        return c.to(torch.uint8)
    per = 8 // bits
    pad = (-d) % per
    if pad:
        c = torch.nn.functional.pad(c, (0, pad))
    c = c.view(*c.shape[:-1], -1, per)
    out = torch.zeros(c.shape[:-1], dtype=torch.int32, device=c.device)
    for i, s in enumerate(_SHIFTS[bits]):
        out |= c[..., i] << s
    return out.to(torch.uint8)


def unpack(packed: torch.Tensor, bits: int, d: int) -> torch.Tensor:
    p = packed.to(torch.int32)
    if bits == 16:
        p = p.view(*p.shape[:-1], -1, 2)
        return p[..., 0] | (p[..., 1] << 8)
    if bits == 8:
        return p
    mask = (1 << bits) - 1
    return torch.stack([(p >> s) & mask for s in _SHIFTS[bits]], dim=-1).flatten(-2)[..., :d]


class ZipState:
    """Block id -> staging entry, shared by every store; per request, its staged blocks."""

    def __init__(self, num_blocks: int, capacity: int, device: torch.device):
        self.capacity = capacity
        self.stage_of = torch.full((num_blocks,), -1, dtype=torch.long, device=device)
        self.entry: dict[int, int] = {}
        self.free = list(range(capacity - 1, -1, -1))
        self.owned: dict[str, list[int]] = {}

    def stage(self, request_id: str, blocks: list[int]) -> None:
        new = [b for b in blocks if b not in self.entry]
        if len(new) > len(self.free):
            raise RuntimeError(f"ZipCache staging exhausted ({self.capacity} blocks)")   # see staging_blocks
        for b in new:
            self.entry[b] = self.free.pop()
            self.owned.setdefault(request_id, []).append(b)
        if new:
            idx = torch.tensor(new, device=self.stage_of.device)
            self.stage_of[idx] = torch.tensor([self.entry[b] for b in new], device=self.stage_of.device)

    def release(self, request_id: str, blocks: list[int]) -> None:
        gone = set(blocks)
        for b in blocks:
            self.free.append(self.entry.pop(b))
        self.stage_of[torch.tensor(blocks, dtype=torch.long, device=self.stage_of.device)] = -1
        rest = [b for b in self.owned.get(request_id, []) if b not in gone]
        if rest:
            self.owned[request_id] = rest
        else:
            self.owned.pop(request_id, None)


class ZipStore:
    def __init__(self, which: str, layout: ZipLayout, state: ZipState, num_blocks: int, heads: int, dims: int,
                 dtype: torch.dtype, device: torch.device, slot_of: torch.Tensor | None = None):
        """``slot_of``: for a V store, its K store's slot map (required when both precisions occur)."""
        lay, bs = layout, layout.block_size
        self.which, self.layout, self.state, self.dims, self.dtype = which, lay, state, dims, dtype
        self.device = torch.device(device)
        self.codec = "zipcache"
        meta = torch.float32 if lay.meta_bytes == 4 else torch.float16
        u8 = dict(dtype=torch.uint8, device=device)
        self.hi = torch.zeros(num_blocks, lay.n_hi, heads, lay.slot_bytes(dims, lay.bits_hi), **u8)
        self.lo = torch.zeros(num_blocks, bs - lay.n_hi, heads, lay.slot_bytes(dims, lay.bits_lo), **u8)
        if which == "v" and lay.mixed:
            if slot_of is None or tuple(slot_of.shape) != (num_blocks, bs, heads):
                raise ValueError("a mixed-precision V store shares its K store's slot map")
            self.slot_of = slot_of                  # written by the K store's flush, same salient set
        else:
            self.slot_of = torch.zeros(num_blocks, bs if lay.mixed else 0, heads, **u8)
        if which == "k":
            self.cmin = torch.zeros(num_blocks, heads, dims, dtype=meta, device=device)
            self.crange = torch.zeros(num_blocks, heads, dims, dtype=meta, device=device)
        else:
            self.cnorm = torch.zeros(num_blocks, heads, dims, dtype=meta, device=device)
            self.tmin = torch.zeros(num_blocks, bs, heads, dtype=meta, device=device)
            self.trange = torch.zeros(num_blocks, bs, heads, dtype=meta, device=device)
        self.bytes_per_block = sum(t[0].numel() * t.element_size() for t in self.tensors())
        self.bytes_per_token = self.bytes_per_block / bs
        # Full-precision window (not part of the pool; planned by ``layout.staging_bytes``).
        self.stage = torch.zeros(state.capacity, bs, heads, dims, dtype=dtype, device=device)
        if which == "k":
            self.sal = torch.zeros(state.capacity, bs, heads, dtype=torch.float32, device=device)
            self.cnt = torch.zeros(state.capacity, bs, dtype=torch.float32, device=device)

    def tensors(self) -> list[torch.Tensor]:
        """The pool's tensors (what ``bytes_per_block`` counts; staging excluded)."""
        names = ("hi", "lo", "slot_of", "cmin", "crange") if self.which == "k" else \
            ("hi", "lo", "cnorm", "tmin", "trange")          # V's slot map is K's
        return [getattr(self, n) for n in names]

    def staging_tensors(self) -> list[torch.Tensor]:
        return [self.stage] + ([self.sal, self.cnt] if self.which == "k" else [])

    # ---- writes go to staging --------------------------------------------
    def write(self, slots: torch.Tensor, x: torch.Tensor) -> None:
        bs = self.layout.block_size
        st = self.state.stage_of[slots // bs]
        self.stage.view(-1, *self.stage.shape[2:]).index_copy_(0, st * bs + slots % bs, x.to(self.dtype))

    # ---- flush: quantise staged blocks into the pool ---------------------
    def flush(self, blocks: torch.Tensor, entries: torch.Tensor, salient: torch.Tensor | None) -> None:
        """Quantise ``stage[entries]`` into ``blocks``; ``salient [m, bs, n]`` bool (exactly n_hi per head)."""
        lay = self.layout
        x = self.stage[entries].float()                                   # [m, bs, n, d]
        meta = self.tensors()[-1].dtype
        tiny = torch.finfo(torch.float16).tiny
        if self.which == "k":                                             # per channel over the block
            lo = x.amin(1)
            cmin = lo.to(meta)
            crange = (x.amax(1) - lo).to(meta).float().clamp_min(tiny)
            u = (x - cmin.float().unsqueeze(1)) / crange.unsqueeze(1)
            self.cmin[blocks], self.crange[blocks] = cmin, crange.to(meta)
        else:                                                             # normalise channels, then per token
            norm = x.abs().amax(1).sqrt().to(meta).float().clamp_min(tiny)
            y = x / norm.unsqueeze(1)
            tmin = y.amin(-1).to(meta)
            trange = (y.amax(-1) - tmin.float()).to(meta).float().clamp_min(tiny)
            u = (y - tmin.float().unsqueeze(-1)) / trange.unsqueeze(-1)
            self.cnorm[blocks], self.tmin[blocks], self.trange[blocks] = norm.to(meta), tmin, trange.to(meta)
        u = u.clamp(0, 1)
        if lay.mixed:
            # salient tokens first (stable: token order within each group)
            order = torch.argsort((~salient).to(torch.int8), dim=1, stable=True)     # [m, bs, n]
            u = u.gather(1, order.unsqueeze(-1).expand_as(u))
            if self.which == "k":                                         # V shares this map
                self.slot_of[blocks] = torch.argsort(order, dim=1).to(torch.uint8)
        if lay.n_hi:
            q = (1 << lay.bits_hi) - 1
            self.hi[blocks] = pack(torch.round(u[:, :lay.n_hi] * q), lay.bits_hi)
        if lay.n_hi < lay.block_size:
            q = (1 << lay.bits_lo) - 1
            self.lo[blocks] = pack(torch.round(u[:, lay.n_hi:] * q), lay.bits_lo)

    # ---- reads -------------------------------------------------------------
    def _u(self, blocks: torch.Tensor) -> torch.Tensor:
        lay, d = self.layout, self.dims
        parts = []
        if lay.n_hi:
            parts.append(unpack(self.hi[blocks], lay.bits_hi, d).float() / ((1 << lay.bits_hi) - 1))
        if lay.n_hi < lay.block_size:
            parts.append(unpack(self.lo[blocks], lay.bits_lo, d).float() / ((1 << lay.bits_lo) - 1))
        u = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)      # [m, bs, n, d], slot order
        if lay.mixed:
            u = u.gather(1, self.slot_of[blocks].long().unsqueeze(-1).expand_as(u))
        return u

    def codes(self, blocks: torch.Tensor):
        """u [m, bs, n, d] in token order and metadata (float32); staged blocks: values, identity metadata.

        K: (u, cmin [m, n, d], crange [m, n, d]);  V: (u, cnorm [m, n, d], tmin [m, bs, n], trange [m, bs, n])."""
        u = self._u(blocks)
        st = self.state.stage_of[blocks]
        staged = st >= 0
        meta = ([self.cmin[blocks].float(), self.crange[blocks].float()] if self.which == "k" else
                [self.cnorm[blocks].float(), self.tmin[blocks].float(), self.trange[blocks].float()])
        if bool(staged.any()):
            u[staged] = self.stage[st[staged]].float()
            identity = (0.0, 1.0) if self.which == "k" else (1.0, 0.0, 1.0)
            for t, val in zip(meta, identity):
                t[staged] = val
        return (u, *meta)

    def gather(self, blocks: torch.Tensor) -> torch.Tensor:
        if self.which == "k":
            u, cmin, crange = self.codes(blocks)
            x = cmin.unsqueeze(1) + u * crange.unsqueeze(1)
        else:
            u, cnorm, tmin, trange = self.codes(blocks)
            x = cnorm.unsqueeze(1) * (tmin.unsqueeze(-1) + u * trange.unsqueeze(-1))
        return x.to(self.dtype)

    def rows(self, slots: torch.Tensor) -> torch.Tensor:
        bs = self.layout.block_size
        return self.gather(slots // bs)[torch.arange(slots.numel(), device=slots.device), slots % bs]
