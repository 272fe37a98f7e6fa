"""LLMEngine: the synchronous engine. ``step()`` = schedule -> run model -> update.

After the update, KV methods see the step (``runner.after_step``) and may return
edits that go through the scheduler (eviction: ``Scheduler.truncate`` frees the
blocks past a request's kept cache entries; its positions are unchanged).
Requests that finish, abort or are preempted are forgotten by the methods.

Speculative decoding (``config.speculative_config``, ``refengine.spec``): the step starts with the
drafter, which leaves a draft on each decoding request that wants one (within the load-aware
budget); a request that verified a draft gets several tokens in one increment. Finished requests
leave their output in the drafter's corpus of recent outputs.

Not thread-safe: one thread owns it (``AsyncEngine`` runs it on a background
thread). Callers speak token ids and ``SamplingParams``; out come
``RequestOutput`` increments (the tokens a request got in a step: one, or more after a verified
draft; the first one carries the prompt logprobs when ``params.prompt_logprobs`` asked for them).

Isolation: ``add_request`` validates every id and option (``ValueError``). If a step's
batch fails anyway, each of its requests is run alone; one that fails alone is
aborted and its error kept for ``take_failures()`` (the async engine hands it to that
request's stream), the others go on (a seeded request that shared the failed step may
draw other random numbers than it would have without the failure). A failure of one
request is that request's, always: it never stops the engine. When every request of
several consecutive steps failed alone, the engine checks itself with a *canary* (a one-token
request of its own, not reported): only if the canary fails alone too is the fault the
engine's (``EngineFault``, raised from ``step``: the serving process then restarts); if it
passes, the failures were the requests' and the engine goes on. An exception outside the
model run (scheduling, the update) is the engine's at once.
"""

from __future__ import annotations

import logging
import time

from refengine.block_groups import WindowedBlocks
from refengine.block_manager import BlockManager
from refengine.config import EngineConfig
from refengine.model_config import load_model_spec
from refengine.outputs import EngineStats, RequestFailed, RequestOutput
from refengine.request import Request, RequestStatus
from refengine.sampling_params import SamplingParams
from refengine.scheduler import Scheduler, SchedulerOutput
from refengine.faults import EngineFault, request_failure
from refengine.spec.check import check_speculation
from refengine.spec.drafter import Drafter
from refengine.structured.grammar import GrammarError, tidy

log = logging.getLogger(__name__)

DEFAULT_MAX_MODEL_LEN = 8192
MAX_FAILED_STEPS = 3     # steps in a row where every request failed alone: the engine checks itself (canary)
CANARY_PREFIX = "__engine-canary-"



class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        from refengine.model_runner import ModelRunner  # torch is imported here, not at package import

        self.config = config
        self.spec = load_model_spec(config.model)
        limit = self.spec.max_position_embeddings
        if config.max_model_len is not None and config.max_model_len > limit:
            raise ValueError(f"max_model_len={config.max_model_len} exceeds the model's "
                             f"max_position_embeddings={limit}")
        self.max_model_len = config.max_model_len or min(limit, DEFAULT_MAX_MODEL_LEN)
        self.runner = ModelRunner(config, self.spec, self.max_model_len)
        windowed = len(self.runner.table_windows) > 1 or self.runner.table_windows[0] is not None
        salt = self.runner.prefix_cache_salt() if config.enable_prefix_caching and not windowed else None
        if config.enable_prefix_caching and windowed:
            log.info("prefix caching off: sliding-window layers free the blocks their window left")
        elif config.enable_prefix_caching and salt is None:
            log.info("prefix caching off: a KV method (%s) stores blocks that are not a function of their prefix",
                     ", ".join(m.name for m in self.runner.kv_methods if not m.prefix_cacheable))
        if windowed:
            self.block_manager = WindowedBlocks(self.runner.table_windows, self.runner.table_blocks, config.block_size)
        else:
            self.block_manager = BlockManager(self.runner.num_blocks, config.block_size,
                                              enable_prefix_caching=salt is not None, salt=salt or b"")
        cap = config.long_prefill_token_threshold
        cap = max(config.block_size, config.max_num_batched_tokens // 2) if cap is None else cap
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, config.max_num_batched_tokens, cap)
        spec = config.speculative_config
        if spec is not None:
            check_speculation(spec, self.runner.kv_methods)          # ValueError naming what cannot verify drafts
        self.drafter = Drafter(spec) if spec is not None else None
        self.eos_token_ids = self.spec.eos_token_ids
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self._failures: dict[str, RequestFailed] = {}
        self._failed_steps = 0
        self._canary: str | None = None          # the id of the running canary (fault accounting)
        self.num_canaries = 0
        self.num_request_failures = 0            # requests aborted because they failed alone
        # Steps that ran a batch, and their wall time (perf_counter): a server's own step time, so that the
        # interval between a stream's tokens can be split into the step and the hand-off (stats().extra).
        self.steps_total = 0
        self.step_seconds_total = 0.0

    # ---- requests -------------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    arrival_time: float | None = None, forced_ids: list[int] | None = None) -> None:
        n = len(prompt_token_ids)
        if n == 0:
            raise ValueError("prompt must contain at least one token")
        if n >= self.max_model_len:
            raise ValueError(f"prompt has {n} tokens; the context is {self.max_model_len} "
                             "and at least one token must be generated")
        vocab = self.spec.vocab_size
        if any(t < 0 or t >= vocab for t in prompt_token_ids):
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        if any(t < 0 or t >= vocab for t in params.stop_token_ids):
            raise ValueError(f"stop_token_ids must be in [0, {vocab})")
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(params, name)
            if k is not None and not 0 <= k <= vocab:
                raise ValueError(f"{name} must be in [0, {vocab}]")
        if any(not 0 <= t < vocab for t, _ in params.logit_bias):
            raise ValueError(f"logit_bias token ids must be in [0, {vocab})")
        if params.speculative and self.drafter is None:
            raise ValueError("speculative decoding was asked for, but this engine has no speculative config "
                             "(start it with --speculative-config)")
        req = Request(request_id, prompt_token_ids, params, self.eos_token_ids, self.max_model_len, arrival_time)
        req.forced_ids = forced_ids
        self.scheduler.add(req)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        req = self.scheduler.abort(request_id)
        if req is None:
            return None
        self.runner.release(request_id)
        if self.drafter is not None:
            self.drafter.finished(req)
        return self._output(req, [], None)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # ---- the step ---------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        t0 = time.perf_counter()
        if self.drafter is not None:
            self.drafter.propose(self.scheduler.running, enabled_by_default=True)
        sched = self.scheduler.schedule()
        self.runner.forget(sched.preempted)        # their blocks are free (and may be reused this step)
        if not sched.chunks:
            return []
        try:
            sampled, logprobs = self.runner.execute(sched)
            self._failed_steps = 0
        except Exception as exc:  # noqa: BLE001 - isolate the request(s) that cause it
            sampled, logprobs = self._isolate(sched, exc)
        before = {c.request.request_id: c.request.num_tokens for c in sched.chunks}
        touched = self.scheduler.update(sched, sampled)
        if self.drafter is not None:
            for c in sched.chunks:
                if c.draft and c.request.request_id in sampled:
                    self.drafter.record(len(c.draft), len(sampled[c.request.request_id]) - 1)
        for edit in self.runner.after_step(sched):
            self.scheduler.truncate(edit.request_id, edit.num_cached)
        outputs = []
        for req in touched:
            if req.request_id == self._canary:       # the engine's own check: passed, not reported
                if req.status.finished:
                    self.runner.release(req.request_id)
                    self._canary, self._failed_steps = None, 0
                continue
            new = req.token_ids[before[req.request_id]:]
            first = req.num_output_tokens == len(new)
            if first:
                self.prompt_tokens_total += req.num_prompt_tokens
            self.generation_tokens_total += len(new)
            lps = logprobs.get(req.request_id)
            out = self._output(req, new, lps[:len(new)] if lps is not None else None)
            if first and req.prompt_lps is not None:
                out.prompt_logprobs = req.prompt_lps     # complete: the prompt's last chunk just sampled
            outputs.append(out)
            if req.status.finished:
                self.runner.release(req.request_id)
                if self.drafter is not None:
                    self.drafter.finished(req)
        self.steps_total += 1
        self.step_seconds_total += time.perf_counter() - t0
        return outputs

    def _isolate(self, sched: SchedulerOutput, exc: Exception) -> tuple[dict, dict]:
        """Run each chunk of a failed batch alone; abort the requests that fail alone.

        Safe to repeat: a chunk rewrites the same KV slots, and progress only moves in
        ``scheduler.update``, after this."""
        named = getattr(exc, "request_id", None)
        culprit = [c for c in sched.chunks if c.request.request_id == named]
        if culprit and named != self._canary and len(sched.chunks) > 1:
            # The error names its request (a grammar that failed while masking): fail it, run the rest
            # together once; only if they fail again, one at a time.
            log.warning("request %s failed a step of %d requests (%s); running the others again", named,
                        len(sched.chunks), tidy(repr(exc)))
            self._fail_chunk(culprit[0], exc, exc)
            rest = SchedulerOutput([c for c in sched.chunks if c is not culprit[0]])
            try:
                out = self.runner.execute(rest)
            except Exception as again:  # noqa: BLE001
                sched, exc = rest, again
            else:
                self._failed_steps = 0
                return out
        log.warning("a step of %d requests failed (%r); running each alone", len(sched.chunks), exc)
        sampled, logprobs, failed = {}, {}, 0
        for chunk in sched.chunks:
            try:
                s, lp = self.runner.execute(SchedulerOutput([chunk]))
            except Exception as one:  # noqa: BLE001
                failed += 1
                self._fail_chunk(chunk, one, exc)
                continue
            sampled.update(s)
            logprobs.update(lp)
        self._failed_steps = self._failed_steps + 1 if failed == len(sched.chunks) else 0
        if self._failed_steps >= MAX_FAILED_STEPS and self._canary is None:
            self._start_canary()
        return sampled, logprobs

    def _fail_chunk(self, chunk, one: Exception, step_exc: Exception) -> None:
        """Abort ``chunk``'s request with its own error ``one`` (the canary's failure is the engine's)."""
        rid = chunk.request.request_id
        if rid == self._canary:
            raise EngineFault(f"the engine cannot run its own one-token check request "
                              f"({type(one).__name__}: {one}); the step had failed with {step_exc!r}") from one
        log.error("request %s failed in the engine: %s", rid, tidy(repr(one)),
                  exc_info=None if isinstance(one, GrammarError) else one)
        req = self.scheduler.abort(rid)
        self.runner.release(rid)
        if self.drafter is not None and req is not None:
            self.drafter.finished(req)
        self.num_request_failures += 1
        self._failures[rid] = request_failure(one)

    def _start_canary(self) -> None:
        """Every request of several steps in a row failed alone: is it them or the engine? A one-token
        greedy request of the engine's own answers it (``_isolate`` raises if it fails alone)."""
        self.num_canaries += 1
        self._canary = f"{CANARY_PREFIX}{self.num_canaries}"
        log.warning("%d steps in a row failed for every request: checking the engine with a canary request",
                    self._failed_steps)
        token = min(self.eos_token_ids) if self.eos_token_ids else 0
        self.add_request(self._canary, [token], SamplingParams(max_tokens=1, temperature=0, ignore_eos=True,
                                                                   speculative=False))

    def take_failures(self) -> dict[str, RequestFailed]:
        """Requests aborted by a failure since the last call: request id -> error."""
        out, self._failures = self._failures, {}
        return out

    def _output(self, req: Request, new_ids: list[int], lps) -> RequestOutput:
        done = req.status.finished
        return RequestOutput(
            request_id=req.request_id,
            new_token_ids=new_ids,
            num_prompt_tokens=req.num_prompt_tokens,
            num_output_tokens=req.num_output_tokens,
            new_logprobs=lps,
            finished=done,
            finish_reason=req.status.value if done else None,
            stop_reason=req.stop_reason,
            timings=req.timings if done else None,
        )

    # ---- convenience (tests, evaluation, benchmarks) --------------------
    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]) -> list[list[int]]:
        """Run prompts to completion; returns the generated token ids of each, in order."""
        plist = params if isinstance(params, list) else [params] * len(prompts)
        ids = [f"gen-{time.monotonic_ns()}-{i}" for i in range(len(prompts))]
        for rid, prompt, p in zip(ids, prompts, plist):
            self.add_request(rid, prompt, p)
        result: dict[str, list[int]] = {rid: [] for rid in ids}
        while self.has_unfinished():
            for out in self.step():
                result[out.request_id].extend(out.new_token_ids)
        failures = self.take_failures()
        if failures:
            raise next(iter(failures.values()))
        return [result[rid] for rid in ids]

    def score(self, items: list[tuple[list[int], list[int]]], want_dist: bool = False) -> list[list[tuple]]:
        """Teacher-force each ``continuation`` after its ``prefix`` *through the KV cache*.

        The prefix is prefilled; every continuation token then runs as a decode step
        reading the cache (so KV methods are exercised as in serving). Returns, per
        item and continuation position, ``(logprob of the true token, argmax token,
        logprob row [V] on CPU or None)``.
        """
        ids = [f"score-{time.monotonic_ns()}-{i}" for i in range(len(items))]
        reqs = {}
        for prefix, cont in items:          # all checked before any is added
            if not cont:
                raise ValueError("empty continuation")
            if len(prefix) + len(cont) > self.max_model_len:
                raise ValueError(f"prefix ({len(prefix)}) + continuation ({len(cont)}) tokens exceed the "
                                 f"context of {self.max_model_len}: fewer log-probs than asked would come back")
        for rid, (prefix, cont) in zip(ids, items):
            p = SamplingParams(max_tokens=len(cont), temperature=0, ignore_eos=True)
            self.add_request(rid, prefix, p, forced_ids=list(cont))
            reqs[rid] = self.scheduler.requests[rid]
        self.runner.want_dist = want_dist
        try:
            while self.has_unfinished():
                self.step()
        finally:
            self.runner.want_dist = False
        failures = self.take_failures()
        if failures:
            raise next(iter(failures.values()))
        return [reqs[rid].score_log for rid in ids]

    def stats(self) -> EngineStats:
        bm, r = self.block_manager, self.runner
        table_bytes, host_bytes = r.table_bytes_per_block(), r.table_bytes_per_block(host=True)
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            kv_usage=bm.usage(),
            kv_blocks_total=bm.num_blocks,
            kv_blocks_used=bm.num_used,
            kv_block_size=bm.block_size,
            kv_bytes_total=r.kv.bytes_total,
            kv_bytes_per_token=float(r.kv.bytes_per_token),
            kv_bytes_per_token_baseline=float(r.bytes_per_token_baseline),
            num_preemptions=self.scheduler.num_preemptions,
            prompt_tokens_total=self.prompt_tokens_total,
            generation_tokens_total=self.generation_tokens_total,
            prefix_caching=bm.enable_prefix_caching,
            prefix_cache_queries=bm.prefix_queries,
            prefix_cache_hits=bm.prefix_hits,
            extra={"kv_bytes_used": float(sum(g.num_used * b for g, b in zip(bm.groups, table_bytes))),
                   "kv_host_bytes_per_token": float(r.kv.host_bytes_per_token),
                   "kv_host_bytes_used": float(sum(g.num_used * b for g, b in zip(bm.groups, host_bytes))),
                   "kv_window_blocks_freed": float(getattr(bm, "blocks_dropped", 0)),
                   "kv_host_bytes_total": float(r.kv.host_bytes_total),
                   "kv_host_bytes_limit": float(r.host_budget or 0),      # 0: no --kv-host-memory-gb
                   "kv_reserved_bytes": float(r.reserved_bytes),
                   "prefix_cached_blocks": float(bm.num_cached_blocks),
                   "swiftkv_layers": float(r.model.num_kv_layers),
                   "swiftkv_group_size": float(r.model.group_size),
                   "engine_request_failures_total": float(self.num_request_failures),
                   "engine_canaries_total": float(self.num_canaries),
                   "engine_steps_total": float(self.steps_total),
                   "engine_step_seconds_total": self.step_seconds_total,
                   **r.kv.stats(), **(self.drafter.stats() if self.drafter is not None else {})},
            spec_decode=self.drafter.counts() if self.drafter is not None else None,
        )


__all__ = ["EngineFault", "LLMEngine", "RequestStatus"]
