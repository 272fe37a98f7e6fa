"""Decode steps on static, padded buffers, replayed from CUDA graphs (issue 46).

A step of eager PyTorch launches every kernel of every layer from Python; on a GPU that host work,
not the memory traffic, sets a decode step's time (results/gpu: 23 ms at batch 1 against a 3.6 ms
bandwidth limit on the 8B shape). ``DecodeGraphs`` runs a *pure-decode* step (every chunk one
token, no draft, nothing scored) from fixed buffers instead:

- ``P`` rows: the smallest captured batch size >= the step's batch (``sizes``: 1, 2, 4, 8, then
  every 8 up to ``max_num_seqs``); ``W`` table columns: the smallest power of two of blocks >= the
  longest row's (up to the longest a request can hold). Each (P, W) pair is one graph.
- Buffers: input ids, positions, slot mapping, lengths ``[P]`` and block tables ``[P, W]``, filled
  from the scheduler's host lists outside the graph (the attention metadata; one copy each).
- Padded rows read token 0 at position 0, write their K/V into the *scratch block* (the pool's
  last block, which the block manager never hands out: ``ModelRunner`` tells it one block fewer)
  and attend its one key; their outputs are dropped.

Inside the graph: the embedding, every layer (QKV, RoPE, the K/V write by ``index_copy_``, the
attention with its padding mask computed from the lengths buffer, the MLP), SwiftKV's tail (the
later layers' fused K/V projection and the later layers on the same rows) and the final norm.
Outside: the buffers' fill, the LM head and sampling (per-request Python: penalties, seeds,
grammar masks). KV methods stay out: KCache's top-N recall and host copies, ZipCache's saliency
probes and eviction's scores read host lists per step (ZACK's parts are not checked for capture
yet), so an engine with any KV method runs every step eagerly (``eligible`` says why). Sliding-window
models too (their per-window tables and lower bounds are not in the buffers yet).

On CUDA (``capture=True``) a pair is captured on its first use (``torch.cuda.graph``, one memory
pool for all; two eager warm-up runs first, which write the same K/V the replay then writes) and
replayed after. On CPU (``capture=False``) the same static, padded path runs eagerly: the tests
compare it with the ordinary path token for token, which is what makes the replay correct.
"""

from __future__ import annotations

import logging

import torch

from refengine.attention import AttnBatch, DecodeGroup

log = logging.getLogger(__name__)


def capture_sizes(max_num_seqs: int) -> list[int]:
    """Batch sizes with a graph: 1, 2, 4, then every 8 up to ``max_num_seqs`` (always included)."""
    sizes = [s for s in (1, 2, 4) if s < max_num_seqs] + list(range(8, max_num_seqs, 8))
    return sizes + [max_num_seqs]


def width_buckets(max_blocks: int) -> list[int]:
    """Block-table widths with a graph: powers of two below ``max_blocks``, then ``max_blocks``."""
    out, w = [], 1
    while w < max_blocks:
        out.append(w)
        w *= 2
    return out + [max_blocks]


def eligible(kv_methods: list, windows: list, device: torch.device, cuda_graphs: bool) -> str | None:
    """Why decode steps cannot run from graphs on this engine, or None when they can."""
    if not cuda_graphs:
        return "off (enforce_eager)"
    if device.type != "cuda":
        return "not on CUDA"
    if kv_methods:
        return "KV methods run their per-step work eagerly: " + ", ".join(m.name for m in kv_methods)
    if any(w is not None for w in windows):
        return "sliding-window layers"
    return None


class DecodeGraphs:
    def __init__(self, model, kv, decode_kernel, block_size: int, scratch_block: int,
                 max_num_seqs: int, max_model_len: int, device: torch.device, capture: bool) -> None:
        self.model, self.kv, self.bs, self.device, self.capture = model, kv, block_size, device, capture
        self.decode_kernel = decode_kernel          # the backend's (None: gather + SDPA); no prefills here
        self.sizes = capture_sizes(max_num_seqs)
        self.widths = width_buckets(-(-max_model_len // block_size))
        self.scratch = scratch_block
        P, W = self.sizes[-1], self.widths[-1]
        z = dict(dtype=torch.long, device=device)
        self.ids, self.pos, self.slots, self.lens = (torch.zeros(P, **z) for _ in range(4))
        self.tables = torch.full((P, W), scratch_block, **z)
        self.rows = torch.arange(P, **z)
        self.span = torch.arange(W * block_size, **z)
        self.graphs: dict[tuple[int, int], tuple[object, torch.Tensor]] = {}
        self.pool = None
        self.replays = 0                         # steps served (tests and the log read it)

    def serves(self, chunks: list) -> bool:
        """A pure-decode step this object can run: one token per chunk, no draft, every chunk samples,
        a batch and a context within the largest graph."""
        if not chunks or len(chunks) > self.sizes[-1]:
            return False
        longest = self.widths[-1] * self.bs
        return all(c.num_tokens == 1 and not c.draft and c.needs_logits and c.cache_start < longest
                   for c in chunks)

    def _fill(self, ids: list[int], pos: list[int], chunks: list, P: int, W: int) -> None:
        """The step's metadata into the buffers' first ``P`` rows (padding rows as the docstring says)."""
        bs, pad = self.bs, P - len(chunks)
        lens = [c.cache_start + 1 for c in chunks]
        slots = [c.block_tables[0][c.cache_start // bs] * bs + c.cache_start % bs for c in chunks]
        tables = torch.full((P, W), self.scratch, dtype=torch.long)
        for i, c in enumerate(chunks):
            row = c.block_tables[0][:-(-lens[i] // bs)]
            tables[i, :len(row)] = torch.tensor(row, dtype=torch.long)
        host = torch.tensor([ids + [0] * pad, pos + [0] * pad, slots + [self.scratch * bs] * pad,
                             lens + [1] * pad], dtype=torch.long)
        for buf, src in zip((self.ids, self.pos, self.slots, self.lens), host):
            buf[:P].copy_(src, non_blocking=True)
        self.tables[:P, :W].copy_(tables, non_blocking=True)

    def _forward(self, P: int, W: int) -> torch.Tensor:
        """The model on the buffers' first P rows and W columns -> final-normed hidden ``[P, hidden]``."""
        lens = self.lens[:P]
        mask = (self.span[:W * self.bs].unsqueeze(0) < lens.unsqueeze(1))[:, None, None, :]
        rows = self.rows[:P]
        d = DecodeGroup(rows, self.tables[:P, :W], mask, [], [], list(range(P)), lens, None)
        batch = AttnBatch([], d, P, self.decode_kernel, None, None)
        attn = [batch] * len(self.kv.windows)
        slots = [self.slots[:P]] * len(self.kv.windows)
        logits_attn = attn if self.model.use_swiftkv else None
        return self.model(self.ids[:P], self.pos[:P], self.kv, attn, slots, rows, logits_attn)

    def _capture(self, P: int, W: int) -> tuple[object, torch.Tensor]:
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):            # lazy initialisations (cuBLAS handles, workspaces) outside
            for _ in range(2):
                self._forward(P, W)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: the structured-output mask thread may touch CUDA while this thread captures
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            out = self._forward(P, W)
        self.pool = graph.pool()
        log.info("captured the decode step for batch %d, %d table blocks (%d graphs)", P, W, len(self.graphs) + 1)
        return graph, out

    def run(self, ids: list[int], pos: list[int], chunks: list) -> torch.Tensor:
        """The step's final-normed hidden rows ``[len(chunks), hidden]`` (valid until the next step)."""
        n = len(chunks)
        P = next(s for s in self.sizes if s >= n)
        need = -(-max(c.cache_start + 1 for c in chunks) // self.bs)
        W = next(w for w in self.widths if w >= need)
        self._fill(ids, pos, chunks, P, W)
        self.replays += 1
        if not self.capture:
            return self._forward(P, W)[:n]
        entry = self.graphs.get((P, W))
        if entry is None:
            entry = self.graphs[(P, W)] = self._capture(P, W)
        entry[0].replay()
        return entry[1][:n]
