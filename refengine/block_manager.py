"""Paged-KV bookkeeping: which fixed-size blocks each request owns. No torch.

The block pool is one list of block ids shared by every KV storage of the engine:
a request's block table indexes the same blocks in every cache slot (each slot has
its own tensor of ``num_blocks`` blocks). A token at position ``p`` of a request
lives in block ``table[p // block_size]`` at offset ``p % block_size``.

Invariants: a block id is either in the free list or in exactly one request's
table; ``num_free + sum(len(tables)) == num_blocks``. ``truncate`` (eviction: the
request's cache entries were compacted to the front) returns the blocks past the
kept tokens to the free list, where any request can take them.
"""

from __future__ import annotations

from collections import deque


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))
        self._tables: dict[str, list[int]] = {}

    # ---- queries -------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def usage(self) -> float:
        return self.num_used / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def table(self, request_id: str) -> list[int]:
        return self._tables.get(request_id, [])

    def can_ever_fit(self, num_tokens: int) -> bool:
        return self.blocks_needed(num_tokens) <= self.num_blocks

    # ---- mutations -----------------------------------------------------
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
        table.extend(self._free.popleft() for _ in range(missing))
        return True

    def truncate(self, request_id: str, num_tokens: int) -> list[int]:
        """Keep the blocks holding the first ``num_tokens`` tokens; free the rest. Returns the freed ids."""
        table = self._tables.get(request_id)
        if table is None:
            return []
        keep = self.blocks_needed(num_tokens)
        freed = table[keep:]
        del table[keep:]
        self._free.extend(freed)
        if not table:
            del self._tables[request_id]
        return freed

    def free(self, request_id: str) -> None:
        table = self._tables.pop(request_id, None)
        if table:
            # Recently freed blocks go to the back: keeps reuse order simple and fair.
            self._free.extend(table)
