"""ZipCache (first abstract of zipcache-and-related-kv-compression-abstracts.txt) as a KV codec.

- Storage: really packed 2/4/8-bit codes (16-bit exists to test the machinery
  losslessly); K quantised per channel over the block, V normalised per channel by
  ``sqrt(max |v|)`` then quantised per token (channel-separable token-wise); layout and
  bytes in ``refengine.kv.methods.zipcache.layout``, stores in ``refengine.kv.methods.zipcache.store``.
- Mixed precision by saliency: each block keeps ``round(salient_ratio * block_size)``
  tokens per KV head at ``bits_hi`` and the rest at ``bits_lo``. A token's saliency is
  its normalised attention score (probabilities it received divided by the number of
  queries that could see it), estimated with probe queries in prefill and with every
  decode query (``refengine.kv.methods.zipcache.ops``). Ranking is within a block: a paged block has
  a fixed number of high-precision slots.
- Window: new tokens stay in full precision (a staging area outside the pool) until
  they are more than ``window`` tokens old; then their block is quantised, with the
  saliency gathered while it was staged (``after_step``, every ``block_size`` tokens).
  Tokens no probe saw (only in SwiftKV's later layers, for chunks before the last of a
  long prompt) are ranked by key norm instead.
- Attention: SDPA over dequantised blocks for prefill chunks; decode folds the
  dequantisation into its products and never forms dequantised K or V.

Options: ``bits_hi``, ``bits_lo`` (2, 4, 8 or 16), ``salient_ratio``, ``window``,
``probe_ratio``. Composes with SwiftKV/AcrossKV and ZACK (it packs ZACK's compressed
heads); refused with another codec (fp8), with eviction and with KCache.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from refengine.kv.base import KVMethod, Options
from refengine.kv.spec import CacheSpec, EngineLimits, GroupSpec, ModelFacts
from refengine.kv.methods.zipcache.layout import ZipLayout, staging_blocks, staging_bytes

Bits = Literal[2, 4, 8, 16]


class ZipCacheOptions(Options):
    bits_hi: Bits = 4
    bits_lo: Bits = 2
    # 0.375 with 32-token blocks: 0.238 of a 16-bit cache at the perplexity 0.25 gave with 16-token
    # blocks (0.273 then); results/kv_methods/zipcache_curve.md has the curve.
    salient_ratio: float = Field(0.375, ge=0.0, le=1.0)
    window: int = Field(32, ge=0, le=4096)
    probe_ratio: float = Field(0.1, gt=0.0, le=1.0)

    @model_validator(mode="after")
    def _check(self):
        if self.bits_hi < self.bits_lo:
            raise ValueError(f"bits_hi ({self.bits_hi}) must be >= bits_lo ({self.bits_lo})")
        return self


class ZipCacheMethod(KVMethod):
    name = "zipcache"
    role = "codec"
    prefix_cacheable = False     # a block's precision split depends on attention from later tokens
    # K's per-channel minimum and range are stored per block: at 32 tokens they cost half the bits
    # per token they cost at 16 (results/kv_methods/zipcache_curve.md). The engine's default
    # block size when ZipCache is on; an explicit --block-size still wins.
    block_size = 32
    OptionsModel = ZipCacheOptions
    summary = ("packed 4/2-bit K (per channel) and V (channel-normalised, per token), salient tokens at bits_hi by "
               "probe-estimated normalised attention, full-precision window; options bits_hi, bits_lo, "
               "salient_ratio, window, probe_ratio")

    def __init__(self, options=None) -> None:
        super().__init__(options)
        self.layout: ZipLayout | None = None
        self.state = None
        self.kstores: list = []          # per (slot, part): (K store, V store) once built
        self._pending: dict = {}
        self.counters = {"zipcache_blocks_flushed": 0.0, "zipcache_probe_queries": 0.0}

    def _layout(self, block_size: int) -> ZipLayout:
        n_hi = round(self.opts.salient_ratio * block_size) if self.opts.bits_hi != self.opts.bits_lo else 0
        return ZipLayout(self.opts.bits_hi, self.opts.bits_lo, n_hi, block_size)

    def validate(self, facts: ModelFacts) -> list[str]:
        if facts.block_size > 256:
            return [f"block_size {facts.block_size} > 256 (token slots are indexed with one byte)"]
        if any(facts.layer_windows):
            return ["models with sliding-window layers are not supported: ZipCache stages blocks by the request's "
                    "global block table, and windowed layers keep tables of their own"]
        return []

    def configure(self, group: GroupSpec, facts: ModelFacts) -> GroupSpec:
        self.layout = self._layout(group.block_size)
        return group.with_(codec="zipcache", codec_owner=self.name, codec_args=self.layout)

    def _staging_blocks(self, limits: EngineLimits) -> int:
        return staging_blocks(self.opts.window, limits.block_size, limits.max_num_seqs,
                              limits.max_num_batched_tokens)

    def reserved_bytes(self, spec: CacheSpec, limits: EngineLimits) -> int:
        self.capacity = self._staging_blocks(limits)
        dims = [(len(p.heads), p.k_dim, p.v_dim) for g in spec.groups for p in g.parts]
        elem = spec.groups[0].elem_bytes if spec.groups else 4
        return staging_bytes(self.capacity, limits.block_size, dims, elem)

    # ---- loading -------------------------------------------------------------
    def make_store(self, group, which, heads, dims, num_blocks, block_size, dtype, device, pin=False):
        from refengine.kv.methods.zipcache.store import ZipState, ZipStore

        if self.state is None:
            capacity = getattr(self, "capacity", None) or self._staging_blocks(EngineLimits(block_size))
            self.state = ZipState(num_blocks, capacity, device)
        shared = self._pending["k"].slot_of if which == "v" else None      # K is made first
        store = ZipStore(which, group.codec_args, self.state, num_blocks, heads, dims, dtype, device, shared)
        if which == "k":
            self._pending["k"] = store
        else:
            self.kstores.append((self._pending.pop("k"), store))
        return store

    def wrap_attention(self, group: GroupSpec, op):
        from refengine.kv.methods.zipcache.ops import ZipAttention

        return ZipAttention(self.opts.probe_ratio, self.counters)

    # ---- serving -------------------------------------------------------------
    def begin_step(self, sched, cache) -> None:
        bs = cache.block_size
        for c in sched.chunks:
            first, last = c.cache_start // bs, (c.cache_start + c.num_tokens - 1) // bs
            self.state.stage(c.request.request_id, c.block_table[first:last + 1])

    def after_step(self, sched, cache) -> list:
        import torch

        bs, w = cache.block_size, self.opts.window
        out, owners = [], []
        for c in sched.chunks:
            req = c.request
            if req.status.finished:
                continue
            old = (req.num_cached_tokens - w) // bs          # blocks [0, old) are older than the window
            done = [b for b in self.state.owned.get(req.request_id, []) if c.block_table.index(b) < old]
            out += done
            owners.append((req.request_id, done))
        if not out:
            return []
        dev = self.state.stage_of.device
        blocks = torch.tensor(out, dtype=torch.long, device=dev)
        entries = self.state.stage_of[blocks]
        lay = self.layout
        for ks, vs in self.kstores:
            salient = None
            if lay.mixed:
                salient = self._salient(ks, entries, lay.n_hi)
            ks.flush(blocks, entries, salient)
            vs.flush(blocks, entries, salient)
            ks.sal[entries] = 0
            ks.cnt[entries] = 0
        for rid, done in owners:
            if done:
                self.state.release(rid, done)
        self.counters["zipcache_blocks_flushed"] += len(out)
        return []

    @staticmethod
    def _salient(kstore, entries, n_hi: int):
        """``[m, bs, n]`` bool: the n_hi tokens per block and head with the highest normalised score."""
        cnt = kstore.cnt[entries]                                         # [m, bs]
        score = kstore.sal[entries] / cnt.clamp_min(1).unsqueeze(-1)      # [m, bs, n]
        unseen = cnt.sum(1) == 0                                          # no probe saw the block
        if bool(unseen.any()):
            score[unseen] = kstore.stage[entries[unseen]].float().norm(dim=-1)
        top = score.topk(n_hi, dim=1).indices
        salient = score.new_zeros(score.shape, dtype=bool)
        return salient.scatter_(1, top, True)

    def forget(self, request_ids) -> None:
        if self.state is None:
            return
        for rid in request_ids:
            blocks = self.state.owned.get(rid)
            if blocks:
                import torch

                entries = self.state.stage_of[torch.tensor(blocks, device=self.state.stage_of.device)]
                for ks, _ in self.kstores:
                    ks.sal[entries] = 0
                    ks.cnt[entries] = 0
                self.state.release(rid, list(blocks))

    def stats(self) -> dict[str, float]:
        lay = self.layout
        out = dict(self.counters)
        if lay is not None:
            out.update({"zipcache_bits_hi": float(lay.bits_hi), "zipcache_bits_lo": float(lay.bits_lo),
                        "zipcache_salient_per_block": float(lay.n_hi), "zipcache_window": float(self.opts.window)})
        if self.state is not None:
            out["zipcache_staged_blocks"] = float(self.state.capacity - len(self.state.free))
        return out
