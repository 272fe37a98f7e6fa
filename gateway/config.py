"""GatewayConfig: the one configuration object of a gateway process (built by the CLI)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.aliases import Alias
from gateway.health import HealthPolicy


@dataclass
class GatewayConfig:
    # discovery: static list, a file (re-read on change) and/or a Kubernetes Service
    workers: list[str] = field(default_factory=list)
    workers_file: str | None = None
    k8s_service: str | None = None
    k8s_namespace: str = "default"
    k8s_port_name: str | None = "http"
    k8s_port: int = 8000
    host: str = "127.0.0.1"
    port: int = 8000
    policy: str = "prefix"                 # prefix | jsq | p2c | round_robin | kv
    # prefix policy (gateway.routing.prefix_aware)
    balance_eps: float = 0.5               # no worker above ceil((1+eps) x mean load) after a decision ...
    balance_floor: float = 2.0             # ... unless that is below this many requests
    prefix_load_weight: float = 0.25       # cost of one request of load, in fractions of a cached prompt
    prefix_block_bytes: int = 128          # prompt bytes per hashed block (~32 tokens)
    prefix_max_blocks: int = 256           # blocks hashed per prompt (longer prompts: first 32 KiB)
    prefix_record_blocks: int = 65536      # blocks remembered per worker (less if it reports a smaller cache)
    prefix_ttl: float = 600.0              # seconds a remembered block counts
    session_header: str = "x-session-id"   # requests with this header stick to one worker and one variant ("" = off)
    # model aliases and weighted splits (gateway.aliases): --alias flags, and a file re-read when it changes
    aliases: list[Alias] = field(default_factory=list)
    models_config: str | None = None
    # the shadow comparison of a canary with its original (gateway.shadow)
    shadow_fraction: float = 0.0           # share of a canary's requests scored, where an alias does not say
    shadow_max_rps: float = 2.0            # comparisons started per second at most (token bucket)
    shadow_max_concurrency: int = 2        # comparisons running at once at most
    shadow_max_load: float = 4.0           # only on a reference worker whose effective load is below this
    shadow_max_tokens: int = 128           # answer tokens compared at most
    shadow_timeout: float = 120.0          # seconds for each request of a comparison
    shadow_yield: str = "reference"        # what comparisons give way to: the reference's load, or "all" clients
    scrape_interval: float = 0.1           # seconds between /metrics scrapes of each worker
    scrape_timeout: float = 0.5
    stale_after: float = 2.0               # scraped figures older than this count as unknown
    connect_timeout: float = 5.0
    first_byte_timeout: float = 600.0      # no byte from the worker for this long: fail over
    max_attempts: int = 2                  # workers tried before the first byte reaches the client (and per migration)
    max_migrations: int = 2                # times one stream may move to another worker after its first byte (0: off)
    stall_timeout: float = 60.0            # mid-stream: no byte for this long is a worker failure
    max_body_bytes: int = 8 * 1024 * 1024
    body_timeout: float = 30.0             # the whole request body must arrive within this (else 408)
    max_response_bytes: int = 256 * 1024 * 1024   # a worker's answer larger than this is cut with an error
    max_inflight_per_worker: int = 0       # 0: unlimited; else saturation point for admission
    max_queue: int = 256
    queue_timeout: float = 30.0
    api_keys: list[str] = field(default_factory=list)
    requests_per_minute: float = 0         # per key; 0 = unlimited
    tokens_per_minute: float = 0           # per key; 0 = unlimited
    protect_metrics: bool = False          # require the API key on /metrics
    protect_health: bool = False           # require the API key on /health
    health: HealthPolicy = field(default_factory=HealthPolicy)
    drain_timeout: float = 30.0            # SIGTERM: seconds in-flight requests get to finish
    # HTTP edge (gateway.connection): request line + headers, header lines, seconds for them to arrive
    max_header_bytes: int = 64 * 1024
    max_headers: int = 100
    header_timeout: float = 10.0
    log_level: str = "info"
