"""SnapKV-style eviction: after the prompt, keep ``budget`` tokens per KV head and free the rest.

SnapKV (and H2O before it) observe that a head attends to a stable set of prompt
positions; the queries of an *observation window* at the end of the prompt reveal it.
Here, per cache slot and KV head:

1. While a request's prompt is prefilled, the queries of its last ``window`` prompt
   positions are recorded as they pass through attention (every layer of the slot;
   in SwiftKV's later layers only the last prompt token has a query).
2. After the step that ends the prompt (``after_step``; the first sampled token is
   already recorded), each recorded query's softmax over the prompt's keys is
   summed per KV head (its query heads and the slot's layers together), pooled along
   positions (``pooling`` over ``kernel`` neighbours, so clustered positions survive
   together), and the ``budget - window`` best prompt positions before the window are
   kept, plus the window itself.
3. The cache compacts each head's kept entries to the front of the request's block
   table (``KVCache.compact``), and the returned ``Truncate`` makes the scheduler free
   the blocks past them: other requests take them at the next step.

Positions: RoPE was applied before the cache write, so kept keys need no
re-rotation. The request keeps counting positions (``num_computed_tokens``) while its
cache holds ``num_cached_tokens = budget`` + generated tokens; the runner gives RoPE
the positions and attention the cache offsets. A prompt of at most ``budget`` tokens
is left alone; a preempted request is recomputed in full and compressed again.

Options: ``budget`` (tokens kept per head), ``window`` (observation window, always
kept), ``kernel`` (odd pooling width), ``pooling`` (max | avg).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from refengine.kv.base import KVMethod, Options, Truncate
from refengine.kv.spec import GroupSpec, ModelFacts


class EvictionOptions(Options):
    budget: int = Field(256, ge=2)
    window: int = Field(16, ge=1)
    kernel: int = Field(7, ge=1, le=63)
    pooling: Literal["max", "avg"] = "max"

    @model_validator(mode="after")
    def _check(self):
        if self.window >= self.budget:
            raise ValueError(f"window ({self.window}) must be smaller than budget ({self.budget})")
        if self.kernel % 2 == 0:
            raise ValueError(f"kernel must be odd (got {self.kernel})")
        return self


class EvictionMethod(KVMethod):
    name = "eviction"
    role = "eviction"
    prefix_cacheable = False     # compaction rewrites a request's blocks in place
    OptionsModel = EvictionOptions
    summary = ("SnapKV-style: after the prompt keep `budget` tokens per KV head chosen by the pooled attention of "
               "the last `window` prompt queries, free the other blocks; options budget, window, kernel, pooling")
    refuses = {"zipcache": "ZipCache quantises whole blocks with per-block channel ranges; moving single tokens "
                           "between blocks would re-quantise them (evict before quantising is not implemented)"}

    def __init__(self, options=None) -> None:
        super().__init__(options)
        self.watch: dict[str, tuple[int, int]] = {}       # request id -> observed cache range [lo, hi)
        self.seen: dict[tuple[int, int, str], list] = {}   # (slot, part, request id) -> [(idx, q, scale)]
        self._parts: dict[int, int] = {}                  # slot -> parts wrapped so far
        self.counters = {"eviction_requests": 0.0, "eviction_tokens_evicted": 0.0, "eviction_blocks_freed": 0.0}

    def validate(self, facts: ModelFacts) -> list[str]:
        if any(facts.layer_windows):
            return ["models with sliding-window layers are not supported: their blocks leave the window through "
                    "the block manager, and compacting a request's cache beside that is not implemented"]
        return []

    def configure(self, group: GroupSpec, facts: ModelFacts) -> GroupSpec:
        return group.with_(may_evict=True)

    def wrap_attention(self, group: GroupSpec, op):
        from refengine.kv.methods.eviction.ops import Observer

        j = self._parts.get(group.slot, 0)
        self._parts[group.slot] = j + 1
        return Observer(op, self, (group.slot, j))

    # ---- serving -----------------------------------------------------------
    def begin_step(self, sched, cache) -> None:
        w, budget = self.opts.window, self.opts.budget
        for c in sched.chunks:
            req = c.request
            if req.prefilled or req.num_tokens <= budget:
                continue
            # The prefill ends at num_tokens (no eviction yet: cache index == position).
            lo, hi = req.num_tokens - w, req.num_tokens
            if c.cache_start + c.num_tokens > lo:
                self.watch[req.request_id] = (lo, hi)

    def after_step(self, sched, cache) -> list[Truncate]:
        from refengine.kv.methods.eviction.ops import select

        edits = []
        for c in sched.chunks:
            req, rid = c.request, c.request.request_id
            if not c.ends_prefill or rid not in self.watch:
                continue
            if req.status.finished or req.num_cached_tokens <= self.opts.budget:
                self.forget([rid])
                continue
            n = req.num_cached_tokens
            keep = []
            for s, slot in enumerate(cache.slots):
                keep.append([select(part, self.seen.get((s, j, rid), []), c.block_table, n, cache.block_size,
                                    self.opts)
                             for j, part in enumerate(slot.parts)])
            cache.compact(c.block_table, keep)
            edits.append(Truncate(rid, self.opts.budget))
            bs = cache.block_size
            self.counters["eviction_requests"] += 1
            self.counters["eviction_tokens_evicted"] += n - self.opts.budget
            self.counters["eviction_blocks_freed"] += -(-n // bs) - -(-self.opts.budget // bs)
            self.forget([rid])
        return edits

    def forget(self, request_ids) -> None:
        for rid in request_ids:
            if self.watch.pop(rid, None) is not None:
                for key in [k for k in self.seen if k[2] == rid]:
                    del self.seen[key]

    def stats(self) -> dict[str, float]:
        return {"eviction_budget": float(self.opts.budget), **self.counters}
