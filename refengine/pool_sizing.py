"""KV pool sizing: how many blocks each table group gets, from the planned cache and the budgets. No torch.

Inputs: the planned ``CacheSpec`` (device and host bytes per block, the attention groups'
windows), the KV methods' fixed reservations (``KVMethod.reserved_bytes``: ZipCache's staging
window) and the ``EngineConfig`` (``kv_cache_memory_gb``, ``kv_host_memory_gb``,
``num_kv_blocks``, ``block_size``, ``free_window_blocks``, chunk sizes).

Table groups: with ``free_window_blocks`` and a sliding-window layer, each attention group
(window) has its own block table and pool (``table_windows`` in the spec's window order,
``table_of[g]`` = g), split by ``refengine.block_groups.split_blocks``; otherwise one table
(``table_windows == [None]``, ``table_of`` all 0) sized by the device budget over the bytes of
every slot. ``num_kv_blocks`` overrides the global group's count (windows in proportion).

Then KCache's host-resident V bounds the pool too (``cap_by_host``: the smaller budget decides;
``host_bound`` says the host one did), and every table must hold one request of
``max_model_len`` or the engine refuses to start, naming the flag to raise.
"""

from __future__ import annotations

from dataclasses import dataclass

from refengine.block_groups import blocks_per_request, cap_by_host, split_blocks
from refengine.config import EngineConfig
from refengine.kv.spec import CacheSpec


@dataclass(frozen=True)
class PoolPlan:
    table_windows: list[int | None]    # per table group: its window (None: global)
    table_of: list[int]                # per attention group (spec.windows order): its table group
    table_blocks: list[int]            # per table group: blocks in its pool
    host_budget: int | None            # bytes (--kv-host-memory-gb), None: unbounded
    host_bound: bool                   # the host budget, not the device one, sized the pool

    @property
    def num_blocks(self) -> int:
        """Blocks of the global (first) table group."""
        return self.table_blocks[0]


def size_pool(config: EngineConfig, spec: CacheSpec, reserved_bytes: int, max_model_len: int) -> PoolPlan:
    """The pool's block counts per table group; ValueError when one request of ``max_model_len``
    does not fit."""
    per_block = spec.device_bytes_per_block
    budget = int(config.kv_cache_memory_gb * (1 << 30)) - reserved_bytes
    windows = spec.windows
    free = config.free_window_blocks and any(w is not None for w in windows)
    table_windows = windows if free else [None]
    table_of = list(range(len(windows))) if free else [0] * len(windows)
    chunk = config.long_prefill_token_threshold or config.max_num_batched_tokens
    need = [blocks_per_request(w, max_model_len, chunk, config.block_size) for w in table_windows]
    if not free:
        counts = [config.num_kv_blocks or max(0, budget // per_block)]
    elif config.num_kv_blocks:              # the first (global) group's count; windows in proportion
        counts = [config.num_kv_blocks * n // need[0] for n in need]
    else:
        counts = split_blocks(budget, windows, spec.window_bytes_per_block(), max_model_len, chunk,
                              config.block_size)
    # Host-resident KV (KCache's V) is bounded too: the smaller budget decides the pool.
    host_per_table = [0] * len(table_windows)
    for g in spec.groups:
        host_per_table[table_of[windows.index(g.window)]] += g.host_bytes_per_block
    host_budget = None if config.kv_host_memory_gb is None else int(config.kv_host_memory_gb * (1 << 30))
    capped = cap_by_host(counts, host_per_table, host_budget)
    host_bound = capped != counts
    for n, want, w in zip(capped, need, table_windows):
        if n < want:
            raise ValueError(
                f"KV cache of {n} blocks x {config.block_size} tokens {'for window ' + str(w) if w else ''} "
                f"cannot hold one request of max_model_len={max_model_len}; " + (
                    f"the host bound --kv-host-memory-gb={config.kv_host_memory_gb:g} holds {n} blocks "
                    f"({sum(host_per_table)} host bytes each), {want} needed: raise it" if host_bound else
                    "raise --kv-cache-memory-gb") + " or lower --max-model-len")
    return PoolPlan(list(table_windows), table_of, capped, host_budget, host_bound)
