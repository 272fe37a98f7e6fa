"""Prometheus metrics of one worker app, under vLLM's names (DESIGN.md section 5).

Each app owns a ``CollectorRegistry`` (no global registry: two apps in one
process do not collide). Two sources:

- Gauges of engine state (``vllm:num_requests_running``/``waiting``,
  ``vllm:kv_cache_usage_perc`` and its older alias ``vllm:gpu_cache_usage_perc``,
  and ``swiftserve_worker_*`` KV figures plus every ``EngineStats.extra`` key) are
  read from ``engine.stats()`` at scrape time by ``_EngineCollector``.
- Latency histograms and token counters are observed by the serving layer through
  one ``RequestTracker`` per engine request: TTFT at the first token, ITL at each
  later increment, e2e / per-output-token / queue / prefill / decode times on the
  final increment (queue and prefill from ``RequestOutput.timings``).

Every series carries vLLM's labels ``model_name`` and ``engine`` ("0"). Counters are
declared without ``_total``; prometheus_client appends it, so the exposed names
are exactly vLLM's (``vllm:prompt_tokens_total``, ``vllm:request_success_total``).
"""

from __future__ import annotations

import logging
import re
import time
from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

# No *_created series: they double the scrape size and the gateway scrapes every 100 ms.
disable_created_metrics()

from refengine.outputs import RequestOutput, RequestTimings
from worker.engine_client import EngineClient

log = logging.getLogger(__name__)

LABELS = ("model_name", "engine")
PREFIX = "swiftserve_worker_"

# Bucket edges as vLLM uses them, so dashboards and quantiles line up.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)


_RESERVED = {PREFIX + n for n in ("engine_healthy", "in_flight_requests", "preemptions", "preemptions_total",
                                  "kv_bytes_per_token", "kv_bytes_per_token_baseline", "kv_compression_ratio",
                                  "kv_blocks_total", "kv_blocks_used", "kv_block_size", "kv_bytes_total")}


def _sanitize(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


class WorkerMetrics:
    def __init__(self, model_name: str, engine: EngineClient, in_flight: Callable[[], int] | None = None) -> None:
        self.registry = CollectorRegistry()
        self.labels = (model_name, "0")
        r, L = self.registry, LABELS

        def hist(name, doc, buckets):
            return Histogram(name, doc, L, buckets=buckets, registry=r).labels(*self.labels)

        self.ttft = hist("vllm:time_to_first_token_seconds", "Time to first token (s).", TTFT_BUCKETS)
        self.itl = hist("vllm:inter_token_latency_seconds", "Time between consecutive outputs (s).", ITL_BUCKETS)
        self.tpot = hist("vllm:request_time_per_output_token_seconds",
                         "Per request: (last token - first token) / (output tokens - 1) (s).", ITL_BUCKETS)
        self.e2e = hist("vllm:e2e_request_latency_seconds", "End-to-end request latency (s).", LATENCY_BUCKETS)
        self.queue = hist("vllm:request_queue_time_seconds", "Time waiting before first scheduled (s).",
                          LATENCY_BUCKETS)
        self.prefill = hist("vllm:request_prefill_time_seconds", "First scheduled to first token (s).",
                            LATENCY_BUCKETS)
        self.decode = hist("vllm:request_decode_time_seconds", "First token to last token (s).", LATENCY_BUCKETS)
        self.inference = hist("vllm:request_inference_time_seconds", "First scheduled to finished (s).",
                              LATENCY_BUCKETS)
        self.req_prompt_tokens = hist("vllm:request_prompt_tokens", "Prompt tokens per request.", TOKEN_BUCKETS)
        self.req_gen_tokens = hist("vllm:request_generation_tokens", "Generated tokens per request.",
                                   TOKEN_BUCKETS)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prefilled prompt tokens.", L,
                                     registry=r).labels(*self.labels)
        self.gen_tokens = Counter("vllm:generation_tokens", "Generated tokens.", L, registry=r).labels(*self.labels)
        self._success = Counter("vllm:request_success", "Finished requests by finish reason.",
                                (*L, "finished_reason"), registry=r)
        r.register(_EngineCollector(engine, self.labels, in_flight))

    def finished(self, reason: str) -> None:
        self._success.labels(*self.labels, reason).inc()

    def tracker(self, arrival: float | None = None) -> "RequestTracker":
        return RequestTracker(self, time.monotonic() if arrival is None else arrival)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RequestTracker:
    """Observes one engine request (one choice). ``arrival`` is when the HTTP request arrived."""

    def __init__(self, metrics: WorkerMetrics, arrival: float) -> None:
        self.m = metrics
        self.arrival = arrival
        self.first: float | None = None
        self.last: float | None = None
        self.num_tokens = 0
        self.num_prompt = 0
        self.done = False

    def on_output(self, out: RequestOutput, now: float | None = None) -> None:
        n = len(out.new_token_ids)
        if n == 0:
            return
        now = time.monotonic() if now is None else now
        if self.first is None:
            self.first = now
            self.num_prompt = out.num_prompt_tokens
            self.m.ttft.observe(now - self.arrival)
            self.m.prompt_tokens.inc(out.num_prompt_tokens)
        elif self.last is not None:
            self.m.itl.observe(now - self.last)
        self.last = now
        self.num_tokens += n
        self.m.gen_tokens.inc(n)

    def on_finish(self, reason: str, timings: RequestTimings | None = None, now: float | None = None) -> None:
        if self.done:
            return
        self.done = True
        now = time.monotonic() if now is None else now
        self.m.finished(reason or "abort")
        self.m.e2e.observe(now - self.arrival)
        if self.first is not None:
            self.m.req_prompt_tokens.observe(self.num_prompt)
            self.m.req_gen_tokens.observe(self.num_tokens)
            if self.num_tokens > 1 and self.last is not None:
                self.m.tpot.observe((self.last - self.first) / (self.num_tokens - 1))
                self.m.decode.observe(self.last - self.first)
        t = timings
        if t is not None and t.first_scheduled is not None:
            self.m.queue.observe(max(0.0, t.first_scheduled - t.arrival))
            if t.first_token is not None:
                self.m.prefill.observe(max(0.0, t.first_token - t.first_scheduled))
            if t.finished is not None:
                self.m.inference.observe(max(0.0, t.finished - t.first_scheduled))


class _EngineCollector:
    """Reads ``engine.stats()`` at scrape time (cheap by the EngineClient contract).

    Speculative decoding, under vLLM's names (present when the engine speculates):
    ``vllm:spec_decode_num_drafts_total`` (verification steps with a draft),
    ``..._num_draft_tokens_total``, ``..._num_accepted_tokens_total`` and
    ``..._num_accepted_tokens_per_pos_total{position="i"}``; acceptance rate = accepted / draft
    tokens, mean accepted length = 1 + accepted / drafts (vLLM's dashboard formulas)."""

    def __init__(self, engine: EngineClient, labels: tuple[str, str], in_flight: Callable[[], int] | None) -> None:
        self.engine = engine
        self.labels = list(labels)
        self.in_flight = in_flight

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, labels=LABELS)
        g.add_metric(self.labels, float(value))
        return g

    def _spec_decode(self, sd):
        for name, doc, value in (("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", sd.num_drafts),
                                 ("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", sd.num_draft_tokens),
                                 ("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.",
                                  sd.num_accepted_tokens)):
            c = CounterMetricFamily(name, doc, labels=LABELS)
            c.add_metric(self.labels, float(value))
            yield c
        c = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.",
                                labels=[*LABELS, "position"])
        for pos, value in enumerate(sd.accepted_per_pos):
            c.add_metric([*self.labels, str(pos)], float(value))
        yield c

    def collect(self):
        g = self._gauge
        yield g(PREFIX + "engine_healthy", "1 when the engine is healthy.", 1.0 if self.engine.healthy() else 0.0)
        if self.in_flight is not None:
            yield g(PREFIX + "in_flight_requests", "Generation HTTP requests in flight.", self.in_flight())
        try:
            s = self.engine.stats()
        except Exception:  # noqa: BLE001 - a scrape must not fail because the engine is down
            log.exception("engine.stats() failed during a scrape")
            return
        yield g("vllm:num_requests_running", "Requests in the running batch.", s.num_running)
        yield g("vllm:num_requests_waiting", "Requests waiting to be scheduled.", s.num_waiting)
        yield g("vllm:kv_cache_usage_perc", "KV-cache usage, 1 = full.", s.kv_usage)
        yield g("vllm:gpu_cache_usage_perc", "KV-cache usage, 1 = full (older name).", s.kv_usage)
        # vLLM's cache-config info gauge (always 1; the figures are labels): the Gateway API
        # Inference Extension and our gateway read the cache size and block size from it.
        info = GaugeMetricFamily("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                                 labels=[*LABELS, "block_size", "num_gpu_blocks", "enable_prefix_caching"])
        info.add_metric([*self.labels, str(s.kv_block_size), str(s.kv_blocks_total), str(s.prefix_caching)], 1.0)
        yield info
        c = CounterMetricFamily("vllm:num_preemptions", "Preemptions in the engine.", labels=LABELS)
        c.add_metric(self.labels, float(s.num_preemptions))
        yield c
        for name, doc, value in (("vllm:prefix_cache_queries", "Prefix-cache queries, in prompt tokens.",
                                  s.prefix_cache_queries),
                                 ("vllm:prefix_cache_hits", "Prefix-cache hits, in prompt tokens.", s.prefix_cache_hits)):
            c = CounterMetricFamily(name, doc, labels=LABELS)
            c.add_metric(self.labels, float(value))
            yield c
        if s.spec_decode is not None:
            yield from self._spec_decode(s.spec_decode)
        c = CounterMetricFamily(PREFIX + "preemptions", "Preemptions in the engine.", labels=LABELS)
        c.add_metric(self.labels, float(s.num_preemptions))
        yield c
        yield g(PREFIX + "kv_bytes_per_token", "KV bytes stored per token (all layers).", s.kv_bytes_per_token)
        yield g(PREFIX + "kv_bytes_per_token_baseline", "KV bytes per token of the same model without KV methods.",
                s.kv_bytes_per_token_baseline)
        ratio = s.kv_bytes_per_token_baseline / s.kv_bytes_per_token if s.kv_bytes_per_token > 0 else 1.0
        yield g(PREFIX + "kv_compression_ratio", "Baseline KV bytes per token / actual (>1 = compressed).", ratio)
        yield g(PREFIX + "kv_blocks_total", "KV blocks in the pool.", s.kv_blocks_total)
        yield g(PREFIX + "kv_blocks_used", "KV blocks in use.", s.kv_blocks_used)
        yield g(PREFIX + "kv_block_size", "Tokens per KV block.", s.kv_block_size)
        yield g(PREFIX + "kv_bytes_total", "Bytes of the KV block pool.", s.kv_bytes_total)
        for key, value in sorted(s.extra.items()):
            name = PREFIX + _sanitize(key)
            if name in _RESERVED:
                continue    # never shadow a fixed series (duplicate names break the exposition)
            try:
                if name.endswith("_total"):          # a running count: a counter (the client adds _total)
                    c = CounterMetricFamily(name[:-len("_total")], f"Engine count {key!r}.", labels=LABELS)
                    c.add_metric(self.labels, float(value))
                    yield c
                else:
                    yield g(name, f"Engine figure {key!r}.", float(value))
            except (TypeError, ValueError):
                continue
