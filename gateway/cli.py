"""``swiftserve-gateway`` / ``python -m gateway``: start the gateway."""

from __future__ import annotations

import argparse
import logging

from gateway.aliases import parse_alias_flag, read_aliases
from gateway.auth import key_id, load_keys
from gateway.config import GatewayConfig
from gateway.health import HealthPolicy
from gateway.routing import POLICIES
from swiftcommon import envs


def parse_args(argv=None) -> GatewayConfig:
    d, h = GatewayConfig(), HealthPolicy()
    p = argparse.ArgumentParser(prog="swiftserve-gateway",
                                description="OpenAI-compatible gateway routing each request to a worker by cached prompt "
                                            "prefix and load (works with SwiftServe workers and stock `vllm serve`). "
                                            "Proxies /v1/completions, /v1/chat/completions, /v1/responses, /tokenize "
                                            "and /detokenize.")
    g = p.add_argument_group("workers (at least one source)")
    g.add_argument("--workers", default=",".join(envs.worker_urls()),
                   help="comma-separated worker base URLs (default: $SWIFTSERVE_WORKERS)")
    g.add_argument("--workers-file", default=None,
                   help="file of worker URLs (one per line, or a YAML/JSON list), re-read when it changes")
    g.add_argument("--k8s-service", default=None, help="discover workers from this Kubernetes Service's EndpointSlices")
    g.add_argument("--k8s-namespace", default=d.k8s_namespace)
    g.add_argument("--k8s-port-name", default=d.k8s_port_name, help="named port of the Service (default: %(default)s)")
    g.add_argument("--k8s-port", type=int, default=d.k8s_port, help="port when the slice names none")
    s = p.add_argument_group("server")
    s.add_argument("--host", default=d.host)
    s.add_argument("--port", type=int, default=d.port)
    s.add_argument("--log-level", default=envs.log_level())
    s.add_argument("--drain-timeout", type=float, default=d.drain_timeout,
                   help="on SIGTERM: new requests get 503 and /health 503 while in-flight requests (streams "
                        "included) get this many seconds to finish; then the gateway exits (default: %(default)s)")
    r = p.add_argument_group("routing")
    r.add_argument("--policy", choices=POLICIES, default=d.policy,
                   help="routing policy: prefix (cached prompt prefix vs load, bounded load; for prompt-heavy "
                        "traffic), jsq (shortest queue), p2c, round_robin, kv (default: %(default)s)")
    r.add_argument("--balance-eps", type=float, default=d.balance_eps,
                   help="prefix: no worker gets a request that would put it above ceil((1+eps) x mean load) "
                        "(default: %(default)s)")
    r.add_argument("--balance-floor", type=float, default=d.balance_floor,
                   help="prefix: the load bound is never below this many requests, so a prefix keeps its "
                        "worker at low load (default: %(default)s)")
    r.add_argument("--prefix-load-weight", type=float, default=d.prefix_load_weight,
                   help="prefix: cost of one request of load against a fully cached prompt (default: %(default)s)")
    r.add_argument("--prefix-block-bytes", type=int, default=d.prefix_block_bytes,
                   help="prefix: prompt bytes per hashed block (default: %(default)s)")
    r.add_argument("--prefix-max-blocks", type=int, default=d.prefix_max_blocks,
                   help="prefix: blocks hashed per prompt (default: %(default)s)")
    r.add_argument("--prefix-record-blocks", type=int, default=d.prefix_record_blocks,
                   help="prefix: blocks remembered per worker, oldest dropped first (default: %(default)s)")
    r.add_argument("--prefix-ttl", type=float, default=d.prefix_ttl,
                   help="prefix: seconds a remembered block counts (default: %(default)s)")
    r.add_argument("--session-header", default=d.session_header,
                   help="requests carrying this header stick to one variant of an alias and (prefix policy) to "
                        "one worker while the load bound allows ('' turns it off) (default: %(default)s)")
    r.add_argument("--scrape-interval", type=float, default=d.scrape_interval, help="seconds (default: %(default)s)")
    r.add_argument("--stale-after", type=float, default=d.stale_after,
                   help="scraped worker figures older than this are ignored (default: %(default)s s)")
    m = p.add_argument_group("models: pools, aliases, weighted splits, shadow comparison (docs/gateway.md)")
    m.add_argument("--alias", action="append", default=[], metavar="NAME=MODEL[:W][,MODEL[:W]...]",
                   help="a public model name sent to served models in proportion to their weights (default 1), "
                        "sticky per --session-header value or the body's 'user'; may be a served model's own "
                        "name (a canary). Repeatable")
    m.add_argument("--models-config", default=None, metavar="FILE",
                   help="YAML/JSON file of aliases (targets with weights, optional shadow spec), re-read when it "
                        "changes; its entries replace --alias ones of the same name")
    m.add_argument("--shadow-fraction", type=float, default=d.shadow_fraction,
                   help="share of a canary's requests whose answer the original scores (the first target of an "
                        "--alias is the original; file entries may say otherwise) (default: %(default)s: off)")
    m.add_argument("--shadow-max-rps", type=float, default=d.shadow_max_rps,
                   help="shadow comparisons started per second at most (default: %(default)s)")
    m.add_argument("--shadow-max-concurrency", type=int, default=d.shadow_max_concurrency,
                   help="shadow comparisons running at once at most (default: %(default)s)")
    m.add_argument("--shadow-max-load", type=float, default=d.shadow_max_load,
                   help="a comparison runs only on an original's worker whose effective load is below this, and "
                        "only while no request waits in the gateway's queue; else it is shed (default: "
                        "%(default)s)")
    m.add_argument("--shadow-yield", choices=("reference", "all"), default=d.shadow_yield,
                   help="what a comparison gives way to. reference: it runs within the bounds above, on the "
                        "original's workers (pools on machines of their own). all: it waits until no client "
                        "request is in flight at the gateway and is stopped (outcome preempted) when one "
                        "arrives (pools that share machines, as `swiftserve up` runs them) (default: %(default)s)")
    m.add_argument("--shadow-max-tokens", type=int, default=d.shadow_max_tokens,
                   help="answer tokens compared at most (default: %(default)s)")
    f = p.add_argument_group("failures and health")
    f.add_argument("--connect-timeout", type=float, default=d.connect_timeout)
    f.add_argument("--first-byte-timeout", type=float, default=d.first_byte_timeout,
                   help="seconds without a byte from a worker before its first byte: fail over "
                        "(default: %(default)s)")
    f.add_argument("--stall-timeout", type=float, default=d.stall_timeout,
                   help="seconds without a byte from a worker mid-stream: the worker has failed (the stream "
                        "migrates when it can, else ends with an error event) (default: %(default)s)")
    f.add_argument("--max-attempts", type=int, default=d.max_attempts,
                   help="workers tried before the first byte reaches the client, and per migration "
                        "(default: %(default)s)")
    f.add_argument("--max-migrations", type=int, default=d.max_migrations,
                   help="times one stream may move to another worker when its worker fails mid-stream "
                        "(streamed completions and chat with one choice, resumed from the token ids already "
                        "sent; 0 turns migration off) (default: %(default)s)")
    f.add_argument("--health-interval", type=float, default=h.interval)
    f.add_argument("--health-fail-threshold", type=int, default=h.fail_threshold)
    f.add_argument("--health-success-threshold", type=int, default=h.success_threshold)
    f.add_argument("--breaker-failures", type=int, default=h.breaker_failures)
    f.add_argument("--breaker-cooldown", type=float, default=h.breaker_cooldown)
    a = p.add_argument_group("admission, auth and limits")
    a.add_argument("--max-inflight-per-worker", type=int, default=d.max_inflight_per_worker,
                   help="a worker with this many requests in flight is saturated (0: unlimited)")
    a.add_argument("--max-queue", type=int, default=d.max_queue, help="requests waiting when all are saturated")
    a.add_argument("--queue-timeout", type=float, default=d.queue_timeout)
    a.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes,
                   help="larger request bodies get 413 (default: %(default)s)")
    a.add_argument("--body-timeout", type=float, default=d.body_timeout,
                   help="seconds for a request body to arrive, else 408 (default: %(default)s)")
    a.add_argument("--max-response-bytes", type=int, default=d.max_response_bytes,
                   help="a worker answer larger than this ends with an error (default: %(default)s)")
    a.add_argument("--api-keys-file", default=None,
                   help="file with one bearer key per line (adds to $SWIFTSERVE_API_KEYS); no keys: no auth")
    a.add_argument("--requests-per-minute", type=float, default=0, help="per key (0: unlimited)")
    a.add_argument("--tokens-per-minute", type=float, default=0, help="per key, prompt + max_tokens (0: unlimited)")
    a.add_argument("--protect-metrics", action="store_true", help="require the API key on /metrics")
    a.add_argument("--protect-health", action="store_true", help="require the API key on /health")
    _edge_flags(p, d)
    x = p.parse_args(argv)
    for name in ("max_attempts", "max_body_bytes", "max_response_bytes", "prefix_block_bytes", "prefix_max_blocks",
                 "prefix_record_blocks", "max_header_bytes", "max_headers"):
        if getattr(x, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if x.max_migrations < 0:
        p.error("--max-migrations must be >= 0")
    if x.drain_timeout < 0:
        p.error("--drain-timeout must be >= 0")
    for name in ("connect_timeout", "first_byte_timeout", "stall_timeout", "body_timeout", "queue_timeout",
                 "prefix_ttl", "header_timeout"):
        if not getattr(x, name) > 0:
            p.error(f"--{name.replace('_', '-')} must be > 0")
    for name in ("balance_eps", "balance_floor", "prefix_load_weight", "shadow_max_rps", "shadow_max_load"):
        if not getattr(x, name) >= 0:
            p.error(f"--{name.replace('_', '-')} must be >= 0")
    if not 0 <= x.shadow_fraction <= 1:
        p.error("--shadow-fraction must be between 0 and 1")
    for name in ("shadow_max_concurrency", "shadow_max_tokens"):
        if getattr(x, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    try:
        aliases = [parse_alias_flag(a, x.shadow_fraction) for a in x.alias]
        if x.models_config:
            read_aliases(x.models_config, x.shadow_fraction)
    except (ValueError, OSError) as exc:
        p.error(str(exc))
    workers = [u.strip().rstrip("/") for u in x.workers.split(",") if u.strip()]
    if not (workers or x.workers_file or x.k8s_service):
        p.error("no workers: pass --workers URL[,URL...], --workers-file, --k8s-service, or set SWIFTSERVE_WORKERS")
    return GatewayConfig(
        workers=workers, workers_file=x.workers_file, k8s_service=x.k8s_service, k8s_namespace=x.k8s_namespace,
        k8s_port_name=x.k8s_port_name, k8s_port=x.k8s_port, host=x.host, port=x.port, policy=x.policy,
        balance_eps=x.balance_eps, balance_floor=x.balance_floor, prefix_load_weight=x.prefix_load_weight, prefix_block_bytes=x.prefix_block_bytes,
        prefix_max_blocks=x.prefix_max_blocks, prefix_record_blocks=x.prefix_record_blocks, prefix_ttl=x.prefix_ttl,
        session_header=x.session_header.strip().lower(), aliases=aliases, models_config=x.models_config,
        shadow_fraction=x.shadow_fraction, shadow_max_rps=x.shadow_max_rps,
        shadow_max_concurrency=x.shadow_max_concurrency, shadow_max_load=x.shadow_max_load,
        shadow_max_tokens=x.shadow_max_tokens, shadow_yield=x.shadow_yield,
        scrape_interval=x.scrape_interval, stale_after=x.stale_after, connect_timeout=x.connect_timeout,
        first_byte_timeout=x.first_byte_timeout, max_attempts=x.max_attempts, max_migrations=x.max_migrations,
        stall_timeout=x.stall_timeout, max_body_bytes=x.max_body_bytes,
        body_timeout=x.body_timeout, max_response_bytes=x.max_response_bytes,
        max_inflight_per_worker=x.max_inflight_per_worker, max_queue=x.max_queue, queue_timeout=x.queue_timeout,
        api_keys=load_keys(envs.api_keys(), x.api_keys_file), requests_per_minute=x.requests_per_minute,
        tokens_per_minute=x.tokens_per_minute, protect_metrics=x.protect_metrics, protect_health=x.protect_health,
        health=HealthPolicy(interval=x.health_interval, fail_threshold=x.health_fail_threshold,
                            success_threshold=x.health_success_threshold, breaker_failures=x.breaker_failures,
                            breaker_cooldown=x.breaker_cooldown),
        drain_timeout=x.drain_timeout, log_level=x.log_level, max_header_bytes=x.max_header_bytes,
        max_headers=x.max_headers, header_timeout=x.header_timeout)


def _edge_flags(p: argparse.ArgumentParser, d: GatewayConfig) -> None:
    """The HTTP edge's limits (gateway.connection); defaults from SWIFTSERVE_<FLAG> (docs/reliability.md)."""
    e = p.add_argument_group("HTTP edge (defaults from SWIFTSERVE_<FLAG>)")
    for flag, kind, text in (
            ("--max-header-bytes", int, "request line and headers together at most (431 beyond)"),
            ("--max-headers", int, "header lines per request at most (431 beyond)"),
            ("--header-timeout", float, "seconds for a request's headers to arrive after its first byte, or after "
                                        "the connection opens (408 and close; a silent connection is closed)")):
        name = flag[2:].replace("-", "_")
        var = "SWIFTSERVE_" + name.upper()
        try:
            default = envs.limit(var, kind(getattr(d, name)))
        except ValueError as exc:
            p.error(str(exc))
        e.add_argument(flag, type=kind, default=default, help=f"{text} (default: %(default)s; env {var})")


def main(argv=None) -> int:
    import uvicorn

    from gateway.app import build_app
    from gateway.connection import edge_protocol
    from gateway.shutdown import DrainingServer
    from swiftcommon.logs import quiet_probe_logs

    cfg = parse_args(argv)
    logging.basicConfig(level=cfg.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_probe_logs()
    log = logging.getLogger("gateway")
    log.info("policy %s; %d static workers; auth %s (keys %s); %d aliases%s", cfg.policy, len(cfg.workers),
             "on" if cfg.api_keys else "off", ", ".join(key_id(k) for k in cfg.api_keys) or "-", len(cfg.aliases),
             f" + {cfg.models_config}" if cfg.models_config else "")
    app = build_app(cfg)
    http = edge_protocol(cfg.max_header_bytes, cfg.max_headers, cfg.header_timeout)
    server = DrainingServer(uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level=cfg.log_level, http=http),
                            app.state.drain, cfg.drain_timeout)
    server.run()
    return 0
