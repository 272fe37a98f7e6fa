"""Gateway metrics (prefix ``swiftserve_gateway_``, never ``vllm:``), in a per-app registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily

# No *_created series (vLLM does not export them either); they double the scrape size.
disable_created_metrics()

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160)


class GatewayMetrics:
    def __init__(self, workers, stale_after: float, now, queued=lambda: 0) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        p = "swiftserve_gateway_"
        self.requests = Counter(p + "requests", "Requests by endpoint and final status", ["endpoint", "status"],
                                registry=r)
        self.routed = Counter(p + "routing_decisions", "Requests dispatched to each worker", ["policy", "worker"],
                              registry=r)
        self.retries = Counter(p + "retries", "Re-dispatches to another worker before the first byte", ["reason"],
                               registry=r)
        self.migrations = Counter(p + "migrations", "Streams moved to another worker after the first byte, by "
                                  "failure and outcome (resumed, failed)", ["reason", "outcome"], registry=r)
        self.rejected = Counter(p + "rejected_requests", "Requests refused by the gateway", ["reason"], registry=r)
        self.ttft = Histogram(p + "time_to_first_token_seconds", "Time from request to the first generated text",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram(p + "time_per_output_token_seconds", "(last - first token) / (tokens - 1), per request",
                              buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28),
                              registry=r)
        self.prefix_cached = Histogram(p + "prefix_cached_fraction",
                                       "Prefix policy: share of the prompt the chosen worker was recorded holding",
                                       buckets=(0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0), registry=r)
        self.e2e = Histogram(p + "e2e_request_latency_seconds", "Time from request to the last response byte",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.workers, self.stale_after, self.now, self.queued = workers, stale_after, now, queued
        r.register(self)

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
        now = self.now()
        for w in self.workers:
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
        q = GaugeMetricFamily("swiftserve_gateway_queue_length", "Requests waiting for a worker with room")
        q.add_metric([], self.queued())
        yield q
