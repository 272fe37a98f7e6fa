"""ModelRunner: the only part of the engine that touches tensors.

It owns the model, the KV cache and the RNGs. At start-up the KV methods
(``config.kv_methods``, parsed when the config was built, + ``kv_cache_dtype``) are
checked and planned once (``registry.check_engine``) before any weight is read;
their load-time weight replacements are applied as the model loads, and the block
pool is sized by the planned device bytes per block (after the methods' fixed
reservations; ``refengine.pool_sizing``). The attention backend
(``refengine.attention_backend``: metadata builder, kernels, paged op) is chosen
once here and handed to the cache and to every step. ``execute(SchedulerOutput)`` turns the
scheduler's token counts and block tables into batch tensors (input ids, true
positions for RoPE, slot mapping and attention over *cache* offsets, which differ
once an eviction method dropped tokens), runs one forward pass and samples one
token for every request whose chunk reached its last known token; prompt logprobs
come from the same pass (``refengine.prompt_logprobs``). ``after_step``
gives KV methods the step after the scheduler's update and collects their edits;
``forget`` drops their per-request state. On CUDA a pure-decode step runs from the static buffers
of ``refengine.graph_decode`` (a captured CUDA graph's replay) when the engine qualifies
(``graphs_off`` says why not); the pool's last block is then its scratch block.

Sliding windows: the cache's attention groups (one per distinct window, global first) map to
*table groups* (``table_of``): with ``free_window_blocks`` each window has its own block table
and pool (``refengine.block_groups`` sizes them: ``table_windows`` / ``table_blocks`` per table
group), otherwise every group reads the one table. Each attention group gets its own
``AttnBatch`` (with its window) and slot mapping per step.
"""

from __future__ import annotations

import logging
import os

import torch

from refengine.attention import slot_mapping
from refengine.attention_backend import select_backend
from refengine import graph_decode
from refengine.config import EngineConfig
from refengine.kv import registry
from refengine.kv.base import Truncate
from refengine.kv.cache import KVCache
from refengine.kv.spec import CacheSpec, EngineLimits
from refengine.linear import check_packed, resolve_packed_linear
from refengine.model_config import ModelSpec
from refengine.models.llama import LlamaModel
from refengine.outputs import TokenLogprob
from refengine.host_malloc import anon_huge_mib, tune_malloc
from refengine.fused_ops import resolve_fused_ops
from refengine.dummy_weights import DummyWeights
from refengine.weights import OverlayWeights
from refengine.quant import gguf_plan, open_gguf, open_safetensors
from refengine.prompt_logprobs import head_rows, score_rows, scored_positions
from refengine.sampler import SampleRow, sample
from refengine.spec.verify import accept
from refengine.structured.masks import GrammarMasks, constrained_ids
from refengine.pool_sizing import size_pool
from refengine.scheduler import SchedulerOutput

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device {name!r} requested but CUDA is not available")
    return dev


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in DTYPES:
        raise ValueError(f"dtype {name!r} not in {sorted(DTYPES)}")
    return DTYPES[name]


def _attn_seqs(entries: list, t: int) -> tuple[list, list]:
    """``(cache start, rows, chunk)`` per sequence -> ``build_batch``'s sequences for table group ``t`` and their
    request ids. A chunk that verifies a draft is described as one
    decode row per token (row i sees the cache up to its own entry), so each row is computed exactly as a
    plain decode step of that token computes it: the same kernel, and KV methods' decode paths (KCache's
    top-N) as they are."""
    seqs, ids = [], []
    for start, n, c in entries:
        table, rid = c.block_tables[t], c.request.request_id
        if c.draft and n > 1:
            seqs.extend((start + i, 1, table) for i in range(n))
            ids.extend([rid] * n)
        else:
            seqs.append((start, n, table))
            ids.append(rid)
    return seqs, ids


class ModelRunner:
    def __init__(self, config: EngineConfig, spec: ModelSpec, max_model_len: int) -> None:
        self.config = config
        self.spec = spec
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        if config.torch_threads and self.device.type == "cpu":
            torch.set_num_threads(config.torch_threads)
        self.malloc_tuned = config.malloc_tuning and self.device.type == "cpu" and tune_malloc()
        torch.manual_seed(config.seed)
        elem = torch.empty((), dtype=self.dtype).element_size()
        # The one check and plan of the KV setting (MethodError: refuse), at the real element size;
        # config.kv_methods arrives parsed. The plan's method objects are the ones that serve.
        self.kv_plan = registry.check_engine(config, spec, elem)
        self.kv_methods, self.cache_spec, facts = list(self.kv_plan.methods), self.kv_plan.spec, self.kv_plan.facts
        quant = None
        if config.load_format == "dummy":             # random weights of the config's shape (benchmarks)
            weights = DummyWeights(spec, config.seed)
        elif config.load_format == "auto":            # safetensors; a W8A8 checkpoint keeps its int8 weights
            weights, quant = open_safetensors(config.model, self.device, self.dtype, config.fused_ops)
        elif config.load_format == "gguf":            # the directory's GGUF, blocks kept (refengine.quant)
            weights, quant = open_gguf(config.model, spec), gguf_plan(self.device, self.dtype)
        else:
            raise ValueError(f"load_format {config.load_format!r} not in ('auto', 'dummy', 'gguf')")
        overrides: dict = {}
        for m in self.kv_methods:
            overrides.update(m.weight_overrides(facts, self.cache_spec, weights))
        self.model = LlamaModel(spec, config.model, self.dtype, self.device, use_swiftkv=config.swiftkv,
                                max_positions=max_model_len, weights=OverlayWeights(weights, overrides),
                                packed_linear=resolve_packed_linear(config.packed_linear, self.device, self.dtype),
                                ops=resolve_fused_ops(config.fused_ops, self.device), quant=quant)
        self.model.eval()
        self.packing = check_packed(self.model, config.packed_linear)
        self.attn_backend = select_backend(config.decode_kernel, config.prefill_kernel, self.device)
        self.bytes_per_token = self.cache_spec.device_bytes_per_token
        self.host_bytes_per_token = self.cache_spec.host_bytes_per_token
        # The same model with no SwiftKV and no KV method: the denominator of compression ratios.
        plain = registry.facts_from_spec(spec, config.model, False, elem, config.block_size)
        self.bytes_per_token_baseline = CacheSpec.for_model(plain).device_bytes_per_token
        limits = EngineLimits(config.block_size, config.max_num_seqs, config.max_num_batched_tokens)
        self.reserved_bytes = sum(m.reserved_bytes(self.cache_spec, limits) for m in self.kv_methods)
        pool = size_pool(config, self.cache_spec, self.reserved_bytes, max_model_len)
        self.table_windows, self.table_of, self.table_blocks = pool.table_windows, pool.table_of, pool.table_blocks
        self.num_blocks = pool.num_blocks        # the global (first) table group
        # CUDA graphs for pure-decode steps (refengine.graph_decode): the pool's last block becomes the
        # padded rows' scratch block, so the block manager is told one block fewer.
        self.graphs_off = graph_decode.eligible(self.kv_methods, self.cache_spec.windows, self.device,
                                                config.cuda_graphs)
        if self.graphs_off is None:
            if self.num_blocks < 2:
                raise ValueError("CUDA-graph decode needs a scratch block: give the pool at least 2 blocks")
            self.num_blocks -= 1
            self.table_blocks = [self.num_blocks]
        self.host_budget, self.host_bound = pool.host_budget, pool.host_bound
        extra = int(self.graphs_off is None)     # the scratch block, beyond the manager's blocks
        self.kv = KVCache(self.cache_spec, self.kv_methods, [self.table_blocks[t] + extra for t in self.table_of],
                          config.block_size, self.dtype, self.device, self.attn_backend.paged)
        planned = (self.cache_spec.device_bytes_per_block, self.cache_spec.host_bytes_per_block)
        if (self.kv.bytes_per_block, self.kv.host_bytes_per_block) != planned:    # the spec is the contract
            raise RuntimeError(f"KV storage allocated {self.kv.bytes_per_block} device + "
                               f"{self.kv.host_bytes_per_block} host bytes/block, planned {planned[0]} + {planned[1]}")
        self.graphs = None if self.graphs_off is not None else graph_decode.DecodeGraphs(
            self.model, self.kv, self.attn_backend.decode_kernel, config.block_size, self.num_blocks,
            config.max_num_seqs, max_model_len, self.device, capture=self.device.type == "cuda")
        self.default_gen = torch.Generator(device=self.device).manual_seed(config.seed)
        # Structured outputs: token masks computed beside the forward pass (built on first use).
        # Beside the forward pass only when a core is free for it (see refengine.structured.masks).
        spare = self.device.type != "cpu" or (os.cpu_count() or 1) > torch.get_num_threads()
        self.grammar = GrammarMasks(config.model, spec.vocab_size, spec.eos_token_ids, overlap=spare)
        self._gens: dict[str, torch.Generator] = {}
        self.want_dist = False                   # scoring: keep full logprob rows (evaluation only)
        log.info("model %s on %s/%s (%s, %s, element-wise ops: %s): "
                 "swiftkv=%s (l=%d, g=%d), KV methods %s, KV blocks %s, %.1f device bytes/token (%.2fx smaller "
                 "than %d), CUDA-graph decode: %s",
                 config.model, self.device, self.dtype, self.packing, self.attn_backend.describe(),
                 self.model.ops.name, self.model.use_swiftkv, self.model.num_kv_layers, self.model.group_size,
                 self.kv_methods or "none", " + ".join(f"{n} ({'window ' + str(w) if w else 'global'})"
                                                       for n, w in zip(self.table_blocks, self.table_windows)),
                 self.bytes_per_token, self.bytes_per_token_baseline / self.bytes_per_token,
                 self.bytes_per_token_baseline, self.graphs_off or "on")
        log.info("%s", self.kv_memory_line())
        huge = anon_huge_mib()
        if huge is not None:                     # what --no-huge-pages / GLIBC_TUNABLES gave this process
            log.info("transparent huge pages: %.0f MiB of this process's anonymous memory", huge)

    def kv_memory_line(self) -> str:
        """The start-up log's KV memory: device and host pools apart (host: KCache's V), the host
        bytes/token added to the device ones in a second ratio, and the host bound if any."""
        dev, host, base = self.bytes_per_token, self.host_bytes_per_token, self.bytes_per_token_baseline
        line = f"KV memory: device {self.kv.bytes_total / (1 << 30):.3f} GiB ({dev:.1f} bytes/token)"
        if host or self.host_budget is not None:
            bound = "unbounded" if self.host_budget is None else f"bound {self.host_budget / (1 << 30):g} GiB" + (
                ", which sized the pool" if self.host_bound else "")
            line += (f", host {self.kv.host_bytes_total / (1 << 30):.3f} GiB ({host:.1f} bytes/token, {bound}); "
                     f"device + host {dev + host:.1f} bytes/token ({base / (dev + host):.2f}x smaller than {base})")
        return line

    def table_bytes_per_block(self, host: bool = False) -> list[int]:
        """Device (or host) bytes per block of each table group's slots."""
        out = [0] * len(self.table_windows)
        for s in self.kv.slots:
            t = self.table_of[self.kv.windows.index(s.group.window)]
            out[t] += s.host_bytes_per_block if host else s.device_bytes_per_block
        return out

    def prefix_cache_salt(self) -> bytes | None:
        """Everything besides the tokens that decides what a block stores, or None when a KV method
        opts out of prefix caching (its blocks are not a function of their prefix)."""
        keys = [m.prefix_cache_key() for m in self.kv_methods]
        if any(k is None for k in keys):
            return None
        m = self.model
        return repr((self.config.model, str(self.dtype), m.use_swiftkv, m.num_kv_layers, m.group_size,
                     self.config.block_size, keys)).encode()

    def release(self, request_id: str) -> None:
        self._gens.pop(request_id, None)
        self.grammar.release(request_id)
        self.forget([request_id])

    def forget(self, request_ids: list[str]) -> None:
        """Requests that finished, aborted or were preempted: KV methods drop their state."""
        if request_ids:
            for m in self.kv_methods:
                m.forget(request_ids)

    @torch.inference_mode()
    def after_step(self, sched: SchedulerOutput) -> list[Truncate]:
        """KV methods' serving hook after the scheduler's update; returns their edits."""
        edits: list[Truncate] = []
        for m in self.kv_methods:
            edits += m.after_step(sched, self.kv) or []
        return edits

    def _generator(self, request_id: str, seed: int | None) -> torch.Generator | None:
        if seed is None:
            return None
        g = self._gens.get(request_id)
        if g is None:
            g = self._gens[request_id] = torch.Generator(device=self.device).manual_seed(seed)
        return g

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput) -> tuple[dict[str, list[int]], dict[str, list[TokenLogprob]]]:
        """Run one step: per request that samples, the tokens it emits (one, or a verified draft's accepted
        tokens and one more: ``refengine.spec.verify``) and their logprobs when it asked for them."""
        dev = self.device
        # Cache offsets (slot mapping, attention lengths) vs true positions (RoPE): they differ
        # by the tokens an eviction method dropped from the request's cache.
        ids, pos, head_idx, tails, sampling, sample_at, scoring = [], [], [], [], [], [], []
        row = 0
        for c in sched.chunks:
            r, end = c.request, c.start + c.num_tokens
            k = len(c.draft)
            ids.extend(r.token_ids[c.start:end - k])
            ids.extend(c.draft)
            pos.extend(range(c.start, end))
            # Rows that go on to the LM head: a suffix [lo, end) of the chunk (prompt logprobs, sampling;
            # a verified draft: its last real token's row and every draft row).
            lo = head_rows(c.start, end - k, r.num_prompt_tokens, r.prompt_lps, c.needs_logits)
            if lo < end:
                n_scored = scored_positions(lo, end - k, r.num_prompt_tokens, r.prompt_lps)
                if n_scored:
                    scoring.append((r, lo, len(head_idx), n_scored))
                if c.needs_logits:
                    sample_at.extend(range(len(head_idx) + end - k - 1 - lo, len(head_idx) + end - lo))
                    sampling.append(c)
                head_idx.extend(range(row + lo - c.start, row + c.num_tokens))
                tails.append((c.cache_start + lo - c.start, end - lo, c))
            row += c.num_tokens
        graphed = self.graphs is not None and not scoring and self.graphs.serves(sched.chunks)
        if not graphed:
            attn_all, slots, logits_idx, attn_logits = self._step_tensors(sched, head_idx, tails)
        # Sampling rows: one per sampling chunk, 1 + len(draft) for a verified draft (row i follows draft[:i]).
        firsts, n_rows = [], 0
        for c in sampling:
            firsts.append(n_rows)
            n_rows += 1 + len(c.draft)
        masks = self.grammar.start([(j, c.request.request_id, c.request.params.structured,
                                     constrained_ids(c.request.params, c.request.output_token_ids), c.draft)
                                    for j, c in zip(firsts, sampling) if c.request.params.structured is not None])
        try:
            if graphed:                         # refengine.graph_decode: static buffers (a CUDA graph's replay)
                hidden = self.graphs.run(ids, pos, sched.chunks)
            else:
                input_ids = torch.tensor(ids, dtype=torch.long, device=dev)
                positions = torch.tensor(pos, dtype=torch.long, device=dev)
                hidden = self.model(input_ids, positions, self.kv, attn_all, slots, logits_idx, attn_logits)   # [N, D]
        except BaseException:
            if masks is not None:
                masks.exception()               # no mask task may outlive its step (see GrammarMasks)
            raise
        return self._finish(hidden, scoring, sampling, sample_at, firsts, n_rows, masks)

    def _step_tensors(self, sched: SchedulerOutput, head_idx: list[int], tails: list) -> tuple:
        """The eager step's attention batches, slot mappings, LM-head rows and SwiftKV's later-layer batches;
        KV methods' ``begin_step`` (they see the batch before the forward pass)."""
        dev, bs = self.device, self.config.block_size
        # Per table group: the step's slot mapping; per attention group (window): its batch.
        table_slots = [slot_mapping([(c.cache_start, c.num_tokens, c.block_tables[t]) for c in sched.chunks], bs, dev)
                       for t in range(len(self.table_windows))]
        slots = [table_slots[t] for t in self.table_of]
        def build(entries, t, window):
            seqs, ids = _attn_seqs(entries, t)
            return self.attn_backend.build_batch(seqs, bs, dev, seq_ids=ids, window=window)
        every = [(c.cache_start, c.num_tokens, c) for c in sched.chunks]
        attn_all = [build(every, t, w) for t, w in zip(self.table_of, self.kv.windows)]
        logits_idx = torch.tensor(head_idx, dtype=torch.long, device=dev)
        attn_logits = None
        if self.model.use_swiftkv:
            # Later layers: the head rows of each sequence, causal over its cache (one query when it only samples).
            attn_logits = [build(tails, t, w) for t, w in zip(self.table_of, self.kv.windows)]
        for m in self.kv_methods:
            m.begin_step(sched, self.kv)
        return attn_all, slots, logits_idx, attn_logits

    def _finish(self, hidden, scoring, sampling, sample_at, firsts, n_rows, masks):
        """Prompt logprobs of scored rows, then the LM head and sampling (see ``execute``)."""
        for r, lo, at, n in scoring:
            if lo + 1 > len(r.prompt_lps):           # scoring requests compute their prompt from position 0
                raise RuntimeError(f"prompt logprobs of {r.request_id!r}: position {lo} follows a gap")
            entries = score_rows(self.model.logits, hidden[at:at + n], r.token_ids[lo + 1:lo + 1 + n],
                                 r.params.prompt_logprobs, r.params.prompt_logprob_ranks)
            r.prompt_lps[lo + 1:] = entries          # by position: a re-run step writes the same entries
        if not sampling:
            return {}, {}
        logits = self.model.logits(hidden[sample_at] if scoring else hidden)
        rows = []
        for c in sampling:
            r = c.request
            p = r.params
            gen = self._generator(r.request_id, p.seed)
            for i in range(len(c.draft) + 1):
                blocked: tuple[int, ...] = ()
                if p.min_tokens and r.num_output_tokens + i < p.min_tokens:
                    blocked = tuple(set(p.stop_token_ids) | (set() if p.ignore_eos else set(r.eos_token_ids)))
                ctx = r.token_ids + c.draft[:i] if i else r.token_ids      # penalties see the drafts before the row
                rows.append(SampleRow(p, ctx, r.num_prompt_tokens, gen, blocked))
        token_masks = self.grammar.result(masks) if masks is not None else None
        if n_rows > len(sampling):           # some request verifies a draft
            res = accept(logits, rows, list(zip(firsts, (c.draft for c in sampling))), self.default_gen, token_masks)
            sampled = {c.request.request_id: toks for c, (toks, _) in zip(sampling, res)}
            logprobs = {c.request.request_id: lps for c, (_, lps) in zip(sampling, res) if lps is not None}
        else:
            tokens, lps = sample(logits, rows, self.default_gen, token_masks)
            sampled = {c.request.request_id: [t] for c, t in zip(sampling, tokens)}
            logprobs = {c.request.request_id: [lp] for c, lp in zip(sampling, lps) if lp is not None}
        forced = [(j, c.request) for j, c in zip(firsts, sampling) if c.request.forced_ids is not None]
        if forced:                           # scoring: never drafts, one row each
            logp = torch.log_softmax(logits[[j for j, _ in forced]].float(), dim=-1)
            for k, (_, r) in enumerate(forced):
                t = r.forced_ids[r.num_output_tokens]
                r.score_log.append((float(logp[k, t]), int(logp[k].argmax()),
                                    logp[k].cpu() if self.want_dist else None))
                sampled[r.request_id] = [t]
        return sampled, logprobs
