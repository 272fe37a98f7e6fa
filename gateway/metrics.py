"""Gateway metrics (prefix ``swiftserve_gateway_``, never ``vllm:``), in a per-app registry.

Per model: the request metrics (requests, routing decisions, retries, migrations, rejections,
TTFT, TPOT, end-to-end latency, prefix share) carry a ``model`` label, the served model the
request was routed to ("" before it was known, e.g. a 400 at the edge or a 404 for an unknown
model), so its values are bounded to the models the workers list. The forwarding code
(gateway.proxy, gateway.failover) records them without knowing the model: ``bind_model`` puts
it in a context variable of the request's task (each request runs in a task of its own, and
tasks it starts inherit it), and the metric objects here add it as their last label.
Split decisions, the shadow comparison (gateway.shadow) and constrained outputs are counted
per variant with explicit labels.
"""

from __future__ import annotations

from contextvars import ContextVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Summary, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily

# No *_created series (vLLM does not export them either); they double the scrape size.
disable_created_metrics()

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160)
SHARE_BUCKETS = (0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0)
_MODEL: ContextVar[str] = ContextVar("swiftserve_gateway_model", default="")


class _ByModel:
    """A labelled metric whose last label, ``model``, is the current request's (``bind_model``)."""

    __slots__ = ("metric",)

    def __init__(self, metric) -> None:
        self.metric = metric

    def labels(self, *values):
        return self.metric.labels(*values, _MODEL.get())

    def observe(self, value: float) -> None:
        self.metric.labels(_MODEL.get()).observe(value)


class GatewayMetrics:
    def __init__(self, workers, stale_after: float, now, queued=lambda: 0) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        p, m = "swiftserve_gateway_", ["model"]
        self.requests = _ByModel(Counter(p + "requests", "Requests by endpoint, final status and model",
                                         ["endpoint", "status", *m], registry=r))
        self.routed = _ByModel(Counter(p + "routing_decisions", "Requests dispatched to each worker",
                                       ["policy", "worker", *m], registry=r))
        self.retries = _ByModel(Counter(p + "retries", "Re-dispatches to another worker before the first byte",
                                        ["reason", *m], registry=r))
        self.migrations = _ByModel(Counter(p + "migrations", "Streams moved to another worker after the first byte, "
                                           "by failure and outcome (resumed, failed)", ["reason", "outcome", *m],
                                           registry=r))
        self.rejected = _ByModel(Counter(p + "rejected_requests", "Requests refused by the gateway", ["reason", *m],
                                         registry=r))
        self.ttft = _ByModel(Histogram(p + "time_to_first_token_seconds", "Time from request to the first generated "
                                       "text", m, buckets=LATENCY_BUCKETS, registry=r))
        self.tpot = _ByModel(Histogram(p + "time_per_output_token_seconds", "(last - first token) / (tokens - 1), "
                                       "per request", m, buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16,
                                                                  0.32, 0.64, 1.28), registry=r))
        self.prefix_cached = _ByModel(Histogram(p + "prefix_cached_fraction", "Prefix policy: share of the prompt the "
                                                "chosen worker was recorded holding", m,
                                                buckets=(0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0), registry=r))
        self.e2e = _ByModel(Histogram(p + "e2e_request_latency_seconds", "Time from request to the last response byte",
                                      m, buckets=LATENCY_BUCKETS, registry=r))
        # model pools, splits and the shadow comparison (explicit labels: alias and served model)
        self.split = Counter(p + "split_requests", "Requests for an alias, by the variant (served model) chosen",
                             ["alias", "model"], registry=r)
        self.shadow_requests = Counter(p + "shadow_requests", "Canary answers picked for a shadow comparison, by "
                                       "outcome (scored, shed_load, shed_rate, shed_concurrency, shed_busy, preempted, "
                                       "no_answer, failed)",
                                       ["model", "outcome"], registry=r)
        # a Summary (sum and count: the mean), since a gap may be negative and a histogram with negative
        # buckets exports no _sum
        self.shadow_gap = Summary(p + "shadow_logprob_gap_nats_per_token", "Reference model's NLL per token of the "
                                  "variant's answer minus that of its own greedy answer to the same prompt", m,
                                  registry=r)
        self.shadow_nll = Histogram(p + "shadow_nll_nats_per_token", "Reference model's NLL per token of an answer "
                                    "(answer=variant: the variant's; answer=reference: its own greedy one)",
                                    ["model", "answer"], buckets=(0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0,
                                                                  6.0, 8.0), registry=r)
        self.shadow_agreement = Histogram(p + "shadow_greedy_agreement", "Share of the variant's answer tokens that "
                                          "are the reference model's greedy choice after the same prefix",
                                          m, buckets=SHARE_BUCKETS, registry=r)
        self.shadow_in_flight = Gauge(p + "shadow_in_flight", "Shadow comparisons running", registry=r)
        self.constrained = Counter(p + "constrained_outputs", "Answers to constrained requests (response_format, "
                                   "structured outputs, forced tool calls) by whether they are structurally valid",
                                   ["model", "valid"], registry=r)
        self.workers, self.stale_after, self.now, self.queued = workers, stale_after, now, queued
        r.register(self)

    @staticmethod
    def bind_model(model: str) -> None:
        """The ``model`` label of the request metrics recorded from now on in this request's task."""
        _MODEL.set(model)

    def describe(self):
        return []

    def collect(self):
        from gateway.routing.base import effective_load

        gauges = {
            "in_flight": GaugeMetricFamily("swiftserve_gateway_worker_in_flight", "Requests in flight per worker",
                                           labels=["worker"]),
            "load": GaugeMetricFamily("swiftserve_gateway_worker_effective_load", "Routing load estimate per worker",
                                      labels=["worker"]),
            "healthy": GaugeMetricFamily("swiftserve_gateway_worker_healthy", "1 if active health checks pass",
                                         labels=["worker"]),
            "routable": GaugeMetricFamily("swiftserve_gateway_worker_routable",
                                          "1 if healthy, circuit closed and not draining", labels=["worker"]),
            "circuit": GaugeMetricFamily("swiftserve_gateway_worker_circuit_open", "1 while the circuit is open",
                                         labels=["worker"]),
            "waiting": GaugeMetricFamily("swiftserve_gateway_worker_queue_waiting",
                                         "Last scraped vllm:num_requests_waiting", labels=["worker"]),
            "running": GaugeMetricFamily("swiftserve_gateway_worker_queue_running",
                                         "Last scraped vllm:num_requests_running", labels=["worker"]),
            "kv": GaugeMetricFamily("swiftserve_gateway_worker_kv_cache_usage",
                                    "Last scraped vllm:kv_cache_usage_perc", labels=["worker"]),
        }
        served = GaugeMetricFamily("swiftserve_gateway_worker_model", "1 for each model a worker lists in /v1/models",
                                   labels=["worker", "model"])
        now = self.now()
        for w in self.workers:
            for model in w.models or ():
                served.add_metric([w.url, model], 1.0)
            gauges["in_flight"].add_metric([w.url], w.in_flight)
            gauges["load"].add_metric([w.url], effective_load(w, now, self.stale_after))
            gauges["healthy"].add_metric([w.url], 1.0 if w.healthy else 0.0)
            gauges["routable"].add_metric([w.url], 1.0 if w.routable(now) else 0.0)
            gauges["circuit"].add_metric([w.url], 1.0 if w.open_until > now else 0.0)
            for key, attr in (("waiting", "waiting"), ("running", "running"), ("kv", "kv_usage")):
                v = getattr(w, attr)
                if v is not None:
                    gauges[key].add_metric([w.url], v)
        yield from gauges.values()
        yield served
        q = GaugeMetricFamily("swiftserve_gateway_queue_length", "Requests waiting for a worker with room")
        q.add_metric([], self.queued())
        yield q
