"""``--engine vllm``: vLLM's AsyncLLM behind the worker's EngineClient contract.

vLLM runs its engine core in its own process; this client lives on the worker's event
loop and only converts: our ``SamplingParams`` -> vLLM's (DELTA outputs, no
detokenisation: stop strings stay at the edge like for the reference engine), vLLM's
outputs -> our ``RequestOutput`` increments (prompt logprobs, which vLLM's DELTA mode sends whole at the
end of prefill, on the first one), and vLLM's scheduler/iteration stats ->
our ``EngineStats`` (so ``/load`` and ``/metrics`` carry the same names for both
engines). Leaving ``generate`` early (client disconnect) aborts the request in vLLM.
``start`` checks the supported vLLM range before anything else; the engine's settings
(``swiftserve_vllm.settings``) are logged. Every vLLM symbol comes from ``swiftserve_vllm.compat``.

The seam: this is the one worker module that imports the plugin (``swiftserve_vllm``;
tests/test_architecture.py holds it to that). ``build_settings`` turns the WorkerConfig into
the plugin's ``VllmOptions``; ``worker.cli`` checks a configuration through it before vLLM starts.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from typing import AsyncIterator

from refengine.model_config import load_model_spec
from refengine.outputs import EngineStats, RequestOutput, RequestTimings, SpecDecodeStats, TokenLogprob
from refengine.sampling_params import SamplingParams
from swiftserve_vllm import settings as plugin_settings
from swiftserve_vllm.settings import VllmOptions, VllmSettings
from worker.config import WorkerConfig

log = logging.getLogger(__name__)
UNNARROWED = "swiftkv_unnarrowed_tail_rows_total"    # EngineStats.extra key: a counter in /metrics


def build_settings(config: WorkerConfig, device: str) -> VllmSettings:
    """The plugin's engine settings for this worker (``ValueError``: vLLM cannot serve it)."""
    options = VllmOptions(
        tokenizer=config.tokenizer_path, served_model_names=config.model_names, max_logprobs=config.max_logprobs,
        enforce_eager=config.vllm_enforce_eager, gpu_memory_utilization=config.vllm_gpu_memory_utilization,
        fast_prefill=config.vllm_fast_prefill, tensor_parallel_size=config.tensor_parallel_size,
        pipeline_parallel_size=config.pipeline_parallel_size, speculative_config=config.speculative_config)
    return plugin_settings.build_settings(config.engine_config, options, device)


class VllmEngineClient:
    def __init__(self, worker_config: WorkerConfig) -> None:
        self.config = worker_config
        self.engine = None
        self.settings: VllmSettings | None = None
        spec = load_model_spec(worker_config.model_dir)
        self.eos_token_ids: tuple[int, ...] = spec.eos_token_ids
        self.max_model_len = 0
        self._stats = EngineStats()
        self._counts = {"prompt_tokens": 0, "generation_tokens": 0, "preemptions": 0}
        self._dead: BaseException | None = None
        self._poller: asyncio.Task | None = None

    # ---- lifecycle ------------------------------------------------------------------
    async def start(self) -> None:
        from swiftserve_vllm import compat as V

        version = V.check_version()
        s = self.settings = build_settings(self.config, V.platform_device())
        os.environ.update(s.env)         # read by vLLM's engine-core and worker processes
        log.info("vLLM %s on %s; %s", version, V.platform_device(), "; ".join(s.notes) or "defaults")
        log.info("vLLM engine arguments: %s", s.engine_kwargs)
        args = V.AsyncEngineArgs(**s.engine_kwargs)
        # Compact JSON, as on the reference engine. vLLM (0.31-0.33) reads this per engine, not
        # per request: its xgrammar and guidance backends ignore a request's disable_any_whitespace,
        # and left at False a small model indents and spends max_tokens on whitespace. The setting
        # needs a named backend ("auto" refuses it): guidance is llguidance, the library the edge
        # checks schemas with and the reference engine runs, so both engines accept the same schemas.
        args.structured_outputs_config.backend = "guidance"
        args.structured_outputs_config.disable_any_whitespace = True
        # Built on the loop: AsyncLLM binds its output handler to it. The lifespan runs this
        # before the server accepts connections, and vLLM's engine core is its own process.
        self.engine = V.AsyncLLM.from_engine_args(args, stat_loggers=[self._stat_logger_factory(V)])
        self.max_model_len = int(self.engine.vllm_config.model_config.max_model_len)
        blocks, block_size = V.kv_capacity(self.engine.vllm_config)
        lay = s.layout
        self._stats = EngineStats(
            kv_blocks_total=blocks, kv_block_size=block_size,
            prefix_caching=bool(getattr(self.engine.vllm_config.cache_config, "enable_prefix_caching", False)),
            kv_bytes_per_token=lay.kv_bytes_per_token(s.dtype_bytes),
            kv_bytes_per_token_baseline=lay.baseline_kv_bytes_per_token(s.model_dtype_bytes),
            kv_bytes_total=blocks * block_size * lay.kv_bytes_per_token(s.dtype_bytes),
            extra=self._extra(blocks * block_size))
        log.info("vLLM KV cache: %d blocks x %d tokens = %d tokens, %d KV bytes/token (baseline %d)",
                 blocks, block_size, blocks * block_size, self._stats.kv_bytes_per_token,
                 self._stats.kv_bytes_per_token_baseline)
        if lay.swiftkv:
            if not s.engine_kwargs.get("kv_sharing_fast_prefill"):
                log.warning("SwiftKV without kv_sharing_fast_prefill: every prompt token runs layers >= %d "
                            "(no prefill saving); counted in swiftserve_worker_swiftkv_unnarrowed_tail_rows_total",
                            lay.num_kv_layers)
            self._poller = asyncio.get_running_loop().create_task(self._poll_counters())

    def _extra(self, capacity_tokens: int) -> dict[str, float]:
        lay = self.settings.layout
        extra = {"kv_capacity_tokens": float(capacity_tokens), "kv_cache_layers": float(lay.num_cache_owners),
                 "swiftkv_num_kv_layers": float(lay.num_kv_layers), "swiftkv_group_size": float(lay.group_size)}
        if lay.swiftkv:
            extra[UNNARROWED] = 0.0
        if lay.zack:
            if lay.zack_rank is not None:
                extra["zack_rank"] = float(lay.zack_rank)
            extra["zack_rank_mean"] = sum(lay.zack_ranks) / len(lay.zack_ranks)
        return extra

    def _stat_logger_factory(self, V):
        client = self

        class _Recorder(V.StatLoggerBase):
            def __init__(self, vllm_config, engine_index: int = 0):
                pass

            def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
                client._record(V, scheduler_stats, iteration_stats)

            def log_engine_initialized(self):
                pass

        return _Recorder

    def _record(self, V, scheduler_stats, iteration_stats) -> None:
        s = self._stats
        if iteration_stats is not None:
            for key, value in V.iteration_figures(iteration_stats).items():
                self._counts[key] += value
        if scheduler_stats is not None:
            f = V.scheduler_figures(scheduler_stats)
            s.num_running, s.num_waiting, s.kv_usage = f["running"], f["waiting"], f["kv_usage"]
            s.kv_blocks_used = round(f["kv_usage"] * s.kv_blocks_total)
            s.prefix_cache_queries += f["prefix_queries"]
            s.prefix_cache_hits += f["prefix_hits"]
            sd = V.spec_figures(scheduler_stats)
            if sd is not None:               # vLLM's per-step counts, summed into vLLM's running counters
                t = s.spec_decode = s.spec_decode or SpecDecodeStats()
                t.num_drafts += sd["num_drafts"]
                t.num_draft_tokens += sd["num_draft_tokens"]
                t.num_accepted_tokens += sd["num_accepted_tokens"]
                per = sd["accepted_per_pos"]
                acc = t.accepted_per_pos + [0] * max(0, len(per) - len(t.accepted_per_pos))
                for i, x in enumerate(per):
                    acc[i] += x
                t.accepted_per_pos = acc
        s.prompt_tokens_total = self._counts["prompt_tokens"]
        s.generation_tokens_total = self._counts["generation_tokens"]
        s.num_preemptions = self._counts["preemptions"]

    async def _poll_counters(self, every: float = 2.0) -> None:
        """The plugin model's count of tail rows fast prefill did not narrow (prompt tokens that ran
        SwiftKV's later layers), read from vLLM's model processes every ``every`` seconds."""
        while True:
            await asyncio.sleep(every)
            try:
                per_rank = await asyncio.wait_for(self.engine.collective_rpc("swiftserve_counters"), timeout=30)
            except Exception:  # noqa: BLE001 - a busy or stopping engine: try again later
                continue
            seen = [r["tail_rows_unnarrowed"] for r in per_rank if r]
            if seen:
                self._stats.extra[UNNARROWED] = float(max(seen))

    async def shutdown(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
        if self.engine is not None:
            self.engine.shutdown()

    def healthy(self) -> bool:
        return self.engine is not None and self._dead is None and not self.engine.errored

    @property
    def prompt_logprobs_refusal(self) -> str | None:
        """Why this engine cannot return prompt logprobs (None: it can). vLLM's fast prefill (our
        SwiftKV path) skips the later layers for prompt tokens and vLLM refuses them then (not for
        prompt_logprobs=0, whose values would be wrong): refused here for every k."""
        cache = getattr(getattr(self.engine, "vllm_config", None), "cache_config", None)
        if cache is not None and getattr(cache, "kv_sharing_fast_prefill", False):
            return ("Prompt logprobs (prompt_logprobs, or echo with logprobs) are not available on this vLLM "
                    "worker: its SwiftKV model runs with kv_sharing_fast_prefill, where prompt tokens skip the "
                    "later layers. Use the reference engine (it runs those layers for such requests) or serve "
                    "the model without SwiftKV.")
        return None

    @property
    def constrained_continuation_refusal(self) -> str:
        """Why a continuation (worker.continuation) under a grammar is refused: vLLM starts a request's
        grammar at its first generated token, and the continuation's tokens are prompt there, so the
        constraint would restart mid-output. Refused, never run unconstrained or restarted."""
        return ("continuation_token_ids cannot be combined with structured outputs or tool_choice 'required' / "
                "a named function on this vLLM worker: vLLM cannot advance a grammar through tokens it did "
                "not generate. Resume it on a reference-engine worker.")

    def stats(self) -> EngineStats:
        return self._stats

    # ---- requests -------------------------------------------------------------------
    def _params(self, p: SamplingParams):
        from swiftserve_vllm import compat as V

        if p.structured is not None and p.structured_prefix:
            raise ValueError(self.constrained_continuation_refusal)      # the edge refuses it first (400)

        return V.SamplingParams(
            n=1, max_tokens=p.max_tokens, min_tokens=p.min_tokens, temperature=p.temperature, top_p=p.top_p,
            top_k=p.top_k, min_p=p.min_p, seed=p.seed, presence_penalty=p.presence_penalty,
            frequency_penalty=p.frequency_penalty, repetition_penalty=p.repetition_penalty,
            stop_token_ids=list(p.stop_token_ids), ignore_eos=p.ignore_eos, logprobs=p.logprobs,
            prompt_logprobs=p.prompt_logprobs, logit_bias=dict(p.logit_bias) or None,
            structured_outputs=_structured(V, p.structured),
            detokenize=False, output_kind=V.RequestOutputKind.DELTA)

    async def generate(self, request_id: str, prompt_token_ids: list[int],
                       params: SamplingParams) -> AsyncIterator[RequestOutput]:
        from swiftserve_vllm import compat as V

        arrival = time.monotonic()
        num_prompt, num_out, finished = len(prompt_token_ids), 0, False
        stream = self.engine.generate(V.TokensPrompt(prompt_token_ids=list(prompt_token_ids)),
                                      self._params(params), request_id)
        try:
            async for out in stream:
                c = out.outputs[0]
                new_ids = list(c.token_ids)
                num_out += len(new_ids)
                finished = bool(out.finished)
                timings = None
                if finished:
                    sched, first = V.request_times(out)
                    timings = RequestTimings(arrival=arrival, first_scheduled=sched, first_token=first,
                                             finished=time.monotonic())
                yield RequestOutput(
                    request_id=request_id, new_token_ids=new_ids, num_prompt_tokens=num_prompt,
                    num_output_tokens=num_out, new_logprobs=_logprobs(new_ids, c.logprobs, params.logprobs),
                    finished=finished, finish_reason=c.finish_reason if finished else None,
                    stop_reason=c.stop_reason if finished else None, timings=timings,
                    prompt_logprobs=_prompt_logprobs(prompt_token_ids, out.prompt_logprobs, params.prompt_logprobs))
                if finished:
                    return
        finally:
            if not finished:
                await self.abort(request_id)
            await stream.aclose()

    async def abort(self, request_id: str) -> None:
        if self.engine is not None:
            await self.engine.abort(request_id)


def _structured(V, spec):
    """Our ``StructuredSpec`` -> vLLM's ``StructuredOutputsParams`` (its own backends enforce it).
    JSON is compact (set for the whole engine in ``start``); a whitespace pattern is refused:
    vLLM's backends take whitespace per engine, so it would be ignored."""
    if spec is None:
        return None
    if spec.kind == "json":
        if spec.whitespace_pattern is not None:
            raise ValueError("whitespace_pattern is not supported with --engine vllm (vLLM sets JSON whitespace "
                             "for the whole engine; this worker runs it compact). Leave it out.")
        return V.StructuredOutputsParams(json=json.loads(spec.text), disable_any_whitespace=True)
    if spec.kind == "choice":
        return V.StructuredOutputsParams(choice=json.loads(spec.text))
    if spec.kind == "regex":
        return V.StructuredOutputsParams(regex=spec.text)
    return V.StructuredOutputsParams(grammar=spec.text)          # GBNF or Lark: vLLM reads both


def _logprobs(new_ids: list[int], vllm_logprobs, k: int | None) -> list[TokenLogprob] | None:
    """vLLM's per-position {token_id: Logprob(logprob, rank)} -> ours (chosen + top-k, best first)."""
    if k is None or vllm_logprobs is None:
        return None
    return [_entry(tok, entry, k) for tok, entry in zip(new_ids, vllm_logprobs)]


def _entry(tok: int, entry: dict, k: int) -> TokenLogprob:
    chosen = entry.get(tok)
    top = sorted(((t, lp.logprob) for t, lp in entry.items() if lp.rank is not None and lp.rank <= k),
                 key=lambda x: -x[1])[:k]
    return TokenLogprob(token_id=tok, logprob=float(chosen.logprob) if chosen else float("-inf"),
                        top=[(int(t), float(v)) for t, v in top], rank=chosen.rank if chosen else None)


def _prompt_logprobs(prompt: list[int], vllm_plps, k: int | None) -> list[TokenLogprob | None] | None:
    """vLLM's prompt logprobs (first increment; entry 0 None) -> ours, one per prompt token."""
    if k is None or not vllm_plps:
        return None
    return [None if entry is None else _entry(tok, entry, k) for tok, entry in zip(prompt, vllm_plps)]
