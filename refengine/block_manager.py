"""Paged-KV bookkeeping with automatic prefix caching: which blocks each request uses. No torch.

The block pool is one list of block ids shared by every KV storage of the engine:
a request's block table indexes the same blocks in every cache slot (each slot has
its own tensor of ``num_blocks`` blocks). A token at position ``p`` of a request
lives in block ``table[p // block_size]`` at offset ``p % block_size``.

Prefix caching (``enable_prefix_caching``): once a block of a request is *full and
computed*, it is registered under a hash chain ``H(parent hash, its block_size token
ids)`` rooted at ``H(salt)`` (``salt`` names everything besides the tokens that decides
what is stored: model, SwiftKV layout, KV methods, dtype). A new request looks its
full prompt blocks up along the chain and shares the hits (reference counts); only the
rest is computed. The last prompt token is never taken from the cache (its logits are
needed), so a request always computes at least one token and never writes into a
shared block: writes go to positions >= its cached prefix, which are in blocks it
owns alone.

Invariants: ``ref[b] == 0`` iff ``b`` is in the free list; a block with ``ref > 0``
is in the tables of exactly ``ref[b]`` requests; ``num_free + used == num_blocks``.
Free blocks form an LRU: freed blocks go to the back (a request's tail blocks ahead
of its head, unregistered blocks at the very front), allocation takes from the
front, and taking a registered block drops its hash. ``truncate`` (eviction compacts a
request's entries in place) is refused while prefix caching is on: registered block
contents must never change.

Sliding windows (``refengine.block_groups``): a manager that serves only windowed layers
drops the blocks a request's window has left (``drop_front``): their table entries become
``NULL_BLOCK`` (the table stays positional: entry ``i`` still means positions
``i*block_size ..``) and they return to the free list. Such a manager runs without prefix
caching.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict

NULL_BLOCK = -1        # a table entry whose block was freed (outside a sliding window); never read


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False,
                 salt: bytes = b"") -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._root = hashlib.sha256(b"swiftserve-prefix\0" + salt).digest()
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._ref = [0] * num_blocks
        self._tables: dict[str, list[int]] = {}
        self._hash_of: dict[int, bytes] = {}        # registered block -> its chain hash
        self._cached: dict[bytes, int] = {}         # chain hash -> block holding it
        self._chains: dict[str, list[bytes]] = {}   # request -> hashes of its full blocks, computed so far
        self._registered: dict[str, int] = {}       # request -> its table blocks registered so far
        self._pending: dict[bytes, str] = {}        # chain hash -> request computing that block now
        self.prefix_queries = 0                     # prompt tokens looked up (vLLM counts tokens)
        self.prefix_hits = 0                        # of which found in the cache

    # ---- queries -------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def usage(self) -> float:
        return self.num_used / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def table(self, request_id: str) -> list[int]:
        return self._tables.get(request_id, [])

    def tables(self, request_id: str) -> list[list[int]]:
        """One table per table group (a single group here; see ``refengine.block_groups``)."""
        return [self.table(request_id)]

    @property
    def groups(self) -> list["BlockManager"]:
        return [self]

    def can_ever_fit(self, num_tokens: int) -> bool:
        return self.blocks_needed(num_tokens) <= self.num_blocks

    # ---- hashing ---------------------------------------------------------
    def _chain(self, request_id: str, token_ids: list[int], num_blocks: int) -> list[bytes]:
        """Chain hashes of the first ``num_blocks`` full blocks of ``token_ids`` (extended lazily)."""
        chain = self._chains.setdefault(request_id, [])
        bs = self.block_size
        while len(chain) < num_blocks:
            i = len(chain)
            parent = chain[-1] if chain else self._root
            chain.append(hashlib.sha256(parent + array("q", token_ids[i * bs:(i + 1) * bs]).tobytes()).digest())
        return chain[:num_blocks]

    def lookup(self, request_id: str, token_ids: list[int]) -> list[int]:
        """Cached blocks holding the longest prefix of ``token_ids`` (all but its last token). No change."""
        if not self.enable_prefix_caching:
            return []
        hits = []
        for h in self._chain(request_id, token_ids, (len(token_ids) - 1) // self.block_size):
            block = self._cached.get(h)
            if block is None:
                break
            hits.append(block)
        return hits

    def in_flight(self, request_id: str, token_ids: list[int], num_hits: int) -> bool:
        """True if the block after the ``num_hits`` cached ones is being computed by another request
        (e.g. ``n > 1`` copies of one prompt): waiting a few steps turns it into a cache hit."""
        if not self.enable_prefix_caching:
            return False
        chain = self._chain(request_id, token_ids, (len(token_ids) - 1) // self.block_size)
        return num_hits < len(chain) and self._pending.get(chain[num_hits], request_id) != request_id

    # ---- mutations -----------------------------------------------------
    def _take(self) -> int:
        block, _ = self._free.popitem(last=False)
        h = self._hash_of.pop(block, None)
        if h is not None and self._cached.get(h) == block:
            del self._cached[h]
        self._ref[block] = 1
        return block

    def allocate(self, request_id: str, hits: list[int], num_tokens: int, num_prompt_tokens: int) -> bool:
        """First allocation of a request: share the ``hits`` (from ``lookup``), grow to ``num_tokens``.

        False (and no change) if the pool is short. Counts ``num_prompt_tokens`` queried and the hits."""
        if request_id in self._tables:
            raise ValueError(f"request {request_id!r} already holds blocks")
        taken_from_free = sum(1 for b in hits if self._ref[b] == 0)
        missing = self.blocks_needed(num_tokens) - len(hits)
        if missing + taken_from_free > len(self._free):
            return False
        for b in hits:
            if self._ref[b] == 0:
                del self._free[b]
            self._ref[b] += 1
        self._tables[request_id] = list(hits)
        self._registered[request_id] = len(hits)
        if self.enable_prefix_caching:
            self.prefix_queries += num_prompt_tokens
            self.prefix_hits += len(hits) * self.block_size
            for h in self._chains.get(request_id, [])[len(hits):]:
                self._pending.setdefault(h, request_id)
        return self.ensure(request_id, num_tokens)

    def ensure(self, request_id: str, num_tokens: int) -> bool:
        """Grow the request's table to hold ``num_tokens`` tokens. False (and no change) if short."""
        table = self._tables.setdefault(request_id, [])
        missing = self.blocks_needed(num_tokens) - len(table)
        if missing <= 0:
            return True
        if missing > len(self._free):
            if not table:
                del self._tables[request_id]
            return False
        table.extend(self._take() for _ in range(missing))
        return True

    def commit(self, request_id: str, token_ids: list[int], num_computed: int) -> None:
        """The request's first ``num_computed`` tokens are in the cache: register its full blocks."""
        if not self.enable_prefix_caching:
            return
        table = self._tables.get(request_id)
        if table is None:
            return
        done = self._registered.get(request_id, 0)
        full = min(num_computed // self.block_size, len(table))
        if full <= done:
            return
        for i, h in enumerate(self._chain(request_id, token_ids, full)[done:], start=done):
            if self._pending.get(h) == request_id:
                del self._pending[h]
            if h not in self._cached:        # an equal block computed twice: the first one stays the cached one
                self._cached[h] = table[i]
                self._hash_of[table[i]] = h
        self._registered[request_id] = full

    def truncate(self, request_id: str, num_tokens: int) -> list[int]:
        """Keep the blocks holding the first ``num_tokens`` tokens; free the rest. Returns the freed ids."""
        if self.enable_prefix_caching:
            raise RuntimeError("truncate (eviction) cannot run with prefix caching: cached blocks would change")
        table = self._tables.get(request_id)
        if table is None:
            return []
        keep = self.blocks_needed(num_tokens)
        freed = table[keep:]
        del table[keep:]
        self._release(freed)
        if not table:
            self.free(request_id)
        return freed

    def drop_front(self, request_id: str, num_blocks: int) -> int:
        """Free the request's first ``num_blocks`` table entries (a window has left them); returns
        how many blocks were freed now. Refused with prefix caching (shared blocks)."""
        if self.enable_prefix_caching:
            raise RuntimeError("drop_front (sliding windows) cannot run with prefix caching")
        table = self._tables.get(request_id)
        if not table:
            return 0
        n = min(num_blocks, len(table))
        gone = [b for b in table[:n] if b != NULL_BLOCK]
        table[:n] = [NULL_BLOCK] * n
        self._release(gone)
        return len(gone)

    def free(self, request_id: str) -> None:
        for h in self._chains.pop(request_id, []):
            if self._pending.get(h) == request_id:
                del self._pending[h]
        self._registered.pop(request_id, None)
        table = self._tables.pop(request_id, None)
        if table:
            self._release(reversed(table))

    def _release(self, blocks) -> None:
        for b in blocks:
            if b == NULL_BLOCK:
                continue
            self._ref[b] -= 1
            if self._ref[b] == 0:
                self._free[b] = None
                if b not in self._hash_of:              # nothing worth keeping: reuse it first
                    self._free.move_to_end(b, last=False)
