"""Token-budget scheduler with chunked prefill and recompute preemption. No torch.

Each step, every scheduled request advances ``num_computed_tokens`` towards
``num_tokens`` by at most the remaining token budget; there is no prefill or
decode "phase": a decode is simply a request one token behind. Running requests
go first (oldest first) so that decodes are never starved by new prompts; then
waiting requests are admitted FIFO while budget, ``max_num_seqs`` and KV blocks
allow. When a running request cannot get a block, the newest running request is
preempted (its blocks freed, ``num_computed_tokens`` reset) and put back at the
head of the waiting queue; it is recomputed later, its sampled tokens kept.

Prefix caching: a request admitted from scratch first takes the cached blocks of its
prompt (``BlockManager.lookup``); its ``num_computed_tokens`` starts at the cached
length, and its computed full blocks are registered after each step (``commit``). A
request whose next uncached block is being computed by another one (``n > 1`` copies
of a prompt) waits until that block is cached instead of computing it again. A request
that wants prompt logprobs takes no cached blocks until they are all computed: they come
from its own prefill rows.
With fewer budget tokens than running requests, the next step resumes after the last
request served; ``long_prefill_cap`` bounds one request's share of a step's budget.

Sliding windows: the block manager may keep one table per window (``refengine.block_groups``);
chunks carry all of them (``block_tables``) and ``commit`` after a step lets windows slide.

Speculative decoding: a decoding request (one token behind) that carries drafted tokens
(``Request.spec_token_ids``, set by ``refengine.spec.Drafter`` before ``schedule``) is scheduled
for ``1 + len(draft)`` tokens (fewer drafts when the budget is short); its chunk lists them
(``draft``). ``update`` then gets the step's emitted tokens per request (accepted drafts and one
more), appends them until one finishes the request, and advances ``num_computed_tokens`` by the
real token and the accepted drafts only: the rejected drafts' cache entries are past it, stale,
and overwritten by the next step (their blocks stay with the request it grows into).

Blocks are counted in cache entries, not positions: after an eviction KV method
dropped tokens (``truncate``, applied between steps), a request needs blocks for
``num_cached_tokens`` entries while its chunks keep their true positions
(``ScheduledChunk.start``, for RoPE) next to their cache offsets (``cache_start``,
for the slot mapping and attention lengths).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from refengine.block_manager import BlockManager
from refengine.request import Request, RequestStatus


@dataclass
class ScheduledChunk:
    request: Request
    start: int              # first position computed this step (= num_computed_tokens before)
    num_tokens: int         # positions start .. start+num_tokens-1
    block_table: list[int]
    cache_start: int = -1   # cache entry of position ``start`` (= start - num_evicted); -1: same as start
    ends_prefill: bool = False  # the first token sampled since the cache was (re)built comes from this chunk
    block_tables: list | None = None   # one table per table group (refengine.block_groups); None: [block_table]
    draft: list[int] = field(default_factory=list)   # drafted tokens verified in this chunk (its last rows)

    def __post_init__(self) -> None:
        if self.cache_start < 0:
            self.cache_start = self.start
        if self.block_tables is None:
            self.block_tables = [self.block_table]

    @property
    def needs_logits(self) -> bool:
        """True when the chunk reaches the last known token: a new token is sampled."""
        return self.start + self.num_tokens - len(self.draft) == self.request.num_tokens


@dataclass
class SchedulerOutput:
    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 long_prefill_cap: int = 0) -> None:
        self.bm = block_manager
        self.long_prefill_cap = long_prefill_cap   # most tokens one request computes in a step (0: no cap)
        self._resume = 0                           # index in ``running`` where the next step starts
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.num_preemptions = 0

    # ---- queue management ---------------------------------------------
    def add(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def abort(self, request_id: str) -> Request | None:
        req = self.requests.get(request_id)
        if req is None or req.status.finished:
            return None
        if req.status is RequestStatus.RUNNING:
            self.running.remove(req)
        else:
            self.waiting.remove(req)
        req.status = RequestStatus.FINISHED_ABORTED
        self._release(req)
        return req

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def _release(self, req: Request) -> None:
        self.bm.free(req.request_id)
        self.requests.pop(req.request_id, None)
        req.timings.finished = time.monotonic()

    def _preempt(self, req: Request) -> None:
        self.bm.free(req.request_id)
        req.num_computed_tokens = 0
        req.num_evicted = 0
        req.prefilled = False
        req.status = RequestStatus.WAITING
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    # ---- the step ---------------------------------------------------------
    def _share(self, req: Request, budget: int) -> int:
        """Tokens ``req`` may compute this step: what is left, within the budget and the long-prefill cap."""
        n = min(req.num_tokens - req.num_computed_tokens, budget)
        if req.spec_token_ids and n == 1:               # decoding with a draft: verify it in this step
            return min(1 + len(req.spec_token_ids), budget)
        return min(n, self.long_prefill_cap) if self.long_prefill_cap and n > 1 else n

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        # Running requests, oldest first, but resuming after the last one served when the budget
        # ran out last step: with fewer tokens than running requests the tail still advances.
        start = self._resume if self._resume < len(self.running) else 0
        order = self.running[start:] + self.running[:start]
        scheduled: dict[str, ScheduledChunk] = {}
        visited = 0
        for req in order:
            if budget <= 0:
                break
            visited += 1
            if req.status is not RequestStatus.RUNNING:
                continue                       # preempted earlier in this step
            n = self._share(req, budget)
            while not self.bm.ensure(req.request_id, req.num_cached_tokens + n):
                victim = self.running.pop()    # the newest request gives its blocks back
                gone = scheduled.pop(victim.request_id, None)
                if gone is not None:           # already served this step: take its chunk back
                    out.chunks.remove(gone)
                    budget += gone.num_tokens
                self._preempt(victim)
                out.preempted.append(victim.request_id)
                if victim is req:
                    break
            else:
                chunk = scheduled[req.request_id] = self._chunk(req, n)
                out.chunks.append(chunk)
                budget -= n
                continue
            break  # the request itself was preempted: nothing newer can run either
        self._resume = start + visited if budget <= 0 and visited < len(order) else 0

        if not out.preempted:
            skipped: list[Request] = []
            while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
                req = self.waiting[0]
                # Prompt logprobs come from the prefill's own rows: such a request computes its prompt.
                scoring = req.needs_prompt_scores
                hits = self.bm.lookup(req.request_id, req.token_ids) if req.num_computed_tokens == 0 \
                    and not scoring else []
                if not scoring and self.bm.in_flight(req.request_id, req.token_ids, len(hits)):
                    skipped.append(self.waiting.popleft())  # its next block is being computed: a hit soon
                    continue
                cached = len(hits) * self.bm.block_size
                req.num_computed_tokens = max(req.num_computed_tokens, cached)
                n = self._share(req, budget)
                if not self.bm.allocate(req.request_id, hits, req.num_cached_tokens + n, req.num_tokens):
                    if cached:
                        req.num_computed_tokens = 0
                    break
                self.waiting.popleft()
                req.status = RequestStatus.RUNNING
                if req.timings.first_scheduled is None:
                    req.timings.first_scheduled = time.monotonic()
                self.running.append(req)
                out.chunks.append(self._chunk(req, n))
                budget -= n
            self.waiting.extendleft(reversed(skipped))
        return out

    def _chunk(self, req: Request, n: int) -> ScheduledChunk:
        start = req.num_computed_tokens
        draft = req.spec_token_ids[:start + n - req.num_tokens] if start + n > req.num_tokens else []
        return ScheduledChunk(req, start, n, self.bm.table(req.request_id), req.num_cached_tokens,
                              ends_prefill=not req.prefilled and start + n == req.num_tokens,
                              block_tables=self.bm.tables(req.request_id), draft=draft)

    def truncate(self, request_id: str, num_cached: int) -> list[int]:
        """An eviction method compacted the request's cache to its first ``num_cached`` entries:
        record the dropped tokens (positions are unchanged) and free the blocks past them."""
        req = self.requests.get(request_id)
        if req is None or req.status is not RequestStatus.RUNNING:
            return []
        if not 0 < num_cached <= req.num_cached_tokens:
            raise ValueError(f"cannot keep {num_cached} of {req.num_cached_tokens} cached tokens of {request_id!r}")
        req.num_evicted += req.num_cached_tokens - num_cached
        return self.bm.truncate(request_id, num_cached)

    def update(self, out: SchedulerOutput, sampled: dict[str, list[int]]) -> list[Request]:
        """Advance progress, append the emitted tokens (one, or a verified draft's accepted tokens and
        one more), retire finished requests.

        Returns the requests that received tokens this step (finished ones included).
        """
        touched: list[Request] = []
        now = time.monotonic()
        for chunk in out.chunks:
            req = chunk.request
            if req.status is not RequestStatus.RUNNING:
                continue  # aborted between schedule and update
            req.spec_token_ids = []
            samples = chunk.needs_logits            # (read before the append changes num_tokens)
            toks = sampled[req.request_id] if samples else ()
            # Kept cache entries: the chunk's real tokens and the drafts accepted (all but the last emitted).
            req.num_computed_tokens += chunk.num_tokens - len(chunk.draft) + (len(toks) - 1 if chunk.draft else 0)
            for t in toks:
                req.append_token(t)
                if req.status.finished:
                    break
            # After the append: accepted drafts are computed tokens whose ids the blocks' hashes need.
            self.bm.commit(req.request_id, req.token_ids, min(req.num_cached_tokens, req.num_tokens))
            if not samples:
                continue
            req.prefilled = True
            if req.timings.first_token is None:
                req.timings.first_token = now
            touched.append(req)
            if req.status.finished:
                self.running.remove(req)
                self._release(req)
        return touched
