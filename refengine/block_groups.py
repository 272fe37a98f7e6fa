"""Block tables per attention window: windowed layers give back the blocks their window has left. No torch.

A model whose layers attend through different windows (Gemma 3: five sliding-window
layers of 512 tokens to one global layer; Mistral or Qwen2 with a window) keeps one
block table per *table group*: the global layers' blocks in one ``BlockManager``, each
window's layers' blocks in another, each with its own pool (the KV tensors of a group's
cache slots have that pool's number of blocks). ``WindowedBlocks`` presents them to the
scheduler with ``BlockManager``'s interface:

- ``allocate`` / ``ensure`` succeed in every group or change nothing (capacity is checked
  in all groups first), so the scheduler's preemption loop works unchanged;
- ``commit(request, tokens, num_computed)`` (called after every step) is where a window
  slides: the next query sits at position ``num_computed`` and sees keys from
  ``num_computed - W + 1`` on (transformers' ``kv_idx > q_idx - W``), so every block wholly
  before that position is freed (``BlockManager.drop_front``). A chunk still gets blocks for
  all of its own tokens: its queries need them while it runs;
- no prefix caching (a shared prefix block may already be outside one request's window)
  and no ``truncate`` (eviction is refused for windowed models by its validation).

Sizing (``split_blocks``): the pools are sized in proportion to what one request of the
full context needs in each group (global: ``ceil(max_len / bs)`` blocks; a window:
``ceil((W - 1 + chunk) / bs) + 1``, the window plus the largest chunk a step computes),
so the budget holds the same number of full-length requests in every group. This is
a fixed split: many short requests fill the windowed pools first (a shared page pool,
as vLLM's hybrid allocator has, would adapt; not done here).
"""

from __future__ import annotations

from refengine.block_manager import BlockManager


def blocks_per_request(window: int | None, max_len: int, chunk: int, block_size: int) -> int:
    """Blocks one request of ``max_len`` tokens holds at most in a group with ``window``."""
    full = -(-max_len // block_size)
    if window is None:
        return full
    return min(full, -(-(window - 1 + chunk) // block_size) + 1)


def split_blocks(budget: int, windows: list[int | None], bytes_per_block: list[int], max_len: int, chunk: int,
                 block_size: int) -> list[int]:
    """Blocks per group for a budget of ``budget`` bytes (proportional to one full-length request's need)."""
    need = [blocks_per_request(w, max_len, chunk, block_size) for w in windows]
    per_request = sum(n * b for n, b in zip(need, bytes_per_block))
    requests = budget / per_request if per_request else 0.0
    return [int(requests * n) for n in need]


def cap_by_host(counts: list[int], host_bytes_per_block: list[int], host_budget: int | None) -> list[int]:
    """Block counts bounded by a host-memory budget (KCache's V pool, ``kv_host_memory_gb``).

    ``counts[t]`` blocks of table group ``t`` hold ``host_bytes_per_block[t]`` host bytes each.
    When their total exceeds ``host_budget`` every group is scaled by the same factor (the split
    between groups is kept), so the smaller of the device and the host budget decides the pool;
    None (no bound) or no host bytes: unchanged. With one group this is ``budget // bytes``."""
    total = sum(n * b for n, b in zip(counts, host_bytes_per_block))
    if host_budget is None or total <= host_budget:
        return list(counts)
    return [n * max(0, host_budget) // total for n in counts]


class WindowedBlocks:
    def __init__(self, windows: list[int | None], num_blocks: list[int], block_size: int) -> None:
        if len(windows) != len(num_blocks) or not windows:
            raise ValueError("one block count per window")
        self.windows = list(windows)
        self.block_size = block_size
        self.groups = [BlockManager(n, block_size) for n in num_blocks]
        self.enable_prefix_caching = False
        self.prefix_queries = self.prefix_hits = 0
        self.num_cached_blocks = 0
        self.blocks_dropped = 0                    # blocks freed because a window left them

    # ---- queries ---------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return sum(g.num_blocks for g in self.groups)

    @property
    def num_used(self) -> int:
        return sum(g.num_used for g in self.groups)

    @property
    def num_free(self) -> int:
        return sum(g.num_free for g in self.groups)

    def usage(self) -> float:
        """The fullest group's share in use: the one that decides admission."""
        return max(g.usage() for g in self.groups)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def table(self, request_id: str) -> list[int]:
        return self.groups[0].table(request_id)

    def tables(self, request_id: str) -> list[list[int]]:
        return [g.table(request_id) for g in self.groups]

    def can_ever_fit(self, num_tokens: int) -> bool:
        return all(g.can_ever_fit(num_tokens) for g in self.groups)

    def lookup(self, request_id: str, token_ids: list[int]) -> list[int]:
        return []

    def in_flight(self, request_id: str, token_ids: list[int], num_hits: int) -> bool:
        return False

    # ---- mutations -------------------------------------------------------
    def _fits(self, request_id: str, num_tokens: int) -> bool:
        need = self.blocks_needed(num_tokens)
        return all(need - len(g.table(request_id)) <= g.num_free for g in self.groups)

    def allocate(self, request_id: str, hits: list[int], num_tokens: int, num_prompt_tokens: int) -> bool:
        if hits:
            raise ValueError("windowed block tables take no prefix-cache hits")
        if not self._fits(request_id, num_tokens):
            return False
        for g in self.groups:
            g.allocate(request_id, [], num_tokens, num_prompt_tokens)
        return True

    def ensure(self, request_id: str, num_tokens: int) -> bool:
        if not self._fits(request_id, num_tokens):
            return False
        for g in self.groups:
            g.ensure(request_id, num_tokens)
        return True

    def commit(self, request_id: str, token_ids: list[int], num_computed: int) -> None:
        """The request's first ``num_computed`` positions are cached: slide every window."""
        for w, g in zip(self.windows, self.groups):
            if w is not None:
                first_seen = max(0, num_computed - w + 1)       # the next query's first key
                self.blocks_dropped += g.drop_front(request_id, first_seen // self.block_size)

    def truncate(self, request_id: str, num_tokens: int) -> list[int]:
        raise RuntimeError("truncate (eviction) is not supported with sliding-window block tables")

    def free(self, request_id: str) -> None:
        for g in self.groups:
            g.free(request_id)
