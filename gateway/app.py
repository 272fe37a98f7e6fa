"""The gateway app: ``build_app(GatewayConfig) -> FastAPI``.

Request path: API key (401, before the body is read) -> body size and deadline (413,
408) -> JSON and required fields (400; gateway.edge) -> the model (gateway.model_routing:
an alias picks a variant, an unknown model is a 404; the request may use only its model's
pool, gateway.pools) -> per-key rate limits (429) -> admission (a worker of the pool with
room, else the bounded queue, else 429; no routable worker: 503) -> forwarding
(gateway.proxy: retries before the first byte, whole JSON answers, SSE passed through; a
stream whose worker fails mid-stream migrates to another worker of the pool
(gateway.failover) or, when it cannot, ends with an in-band error event). On SIGTERM
the gateway drains (gateway.shutdown: new requests 503, ``/health`` 503, in-flight ones
finish). Answers that a shadow comparison samples, and constrained ones, are read as they
pass (gateway.shadow); the comparison runs after the client has its answer.

Every answer the gateway makes itself is OpenAI-style JSON, unknown routes (404) and
wrong methods (405) included; an unexpected exception is a JSON 500 with one log line
(gateway.asgi, with the fast path the proxied routes take).

``build_app`` runs named steps: ``_make_parts`` (the shared objects, also on ``app.state``;
the app's ``client`` is opened by ``_lifespan``), ``_proxy_handler`` (the request path
above), ``_install_proxy`` (the fast path and the schema routes), ``_add_own_routes``
(``/v1/models``, ``/health``, ``/metrics``).
"""

from __future__ import annotations

import asyncio
import random
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.admission import Admission, Rejected
from gateway.aliases import AliasTable
from gateway.asgi import FastPath, install_error_handlers
from gateway.auth import CHALLENGE, Auth, estimate_tokens, requested_tokens
from gateway.config import GatewayConfig
from gateway.discovery import WorkerPool, watch_file, watch_kubernetes
from gateway.edge import EdgeError, parse_body, read_body, until_client_gone
from gateway.errors import error
from gateway.health import Health
from gateway.metrics import GatewayMetrics
from gateway.migration import tracker_for
from gateway.model_routing import ModelError, ModelRouter
from gateway.pools import ModelDirectory
from gateway.prefix import PrefixIndex, block_hashes, prompt_bytes
from gateway.routing.base import RouteRequest
from gateway.proxy import Forwarder
from gateway.routing import make_policy
from gateway.scraper import Scraper
from gateway.shadow import ShadowMonitor
from gateway.shutdown import Drain
from gateway.upstream import upstream_session


def _rejected(m: GatewayMetrics, exc: Rejected) -> JSONResponse:
    m.rejected.labels(exc.reason).inc()
    kind = {401: "authentication_error", 429: "rate_limit_error", 503: "service_unavailable"}.get(
        exc.status, "invalid_request_error")
    headers = {"Retry-After": str(max(1, round(exc.retry_after)))} if exc.status in (429, 503) else \
        CHALLENGE if exc.status == 401 else None
    return error(exc.status, str(exc), kind, code=exc.reason, headers=headers)


@dataclass
class _Parts:
    """The objects one gateway app shares; ``build_app`` puts them on ``app.state`` too."""

    config: GatewayConfig
    pool: WorkerPool
    health: Health
    admission: Admission
    auth: Auth
    prefix_index: PrefixIndex
    metrics: GatewayMetrics
    drain: Drain
    forwarder: Forwarder
    directory: ModelDirectory
    router: ModelRouter
    shadow: ShadowMonitor


def build_app(config: GatewayConfig) -> FastAPI:
    """The gateway app: its shared objects, lifespan, error handlers, the proxied routes
    (on the fast path) and the gateway's own routes."""
    p = _make_parts(config)
    app = FastAPI(title="SwiftServe gateway", lifespan=_lifespan(p))
    install_error_handlers(app)
    app.state.config, app.state.pool, app.state.metrics = config, p.pool, p.metrics
    app.state.admission, app.state.health, app.state.auth = p.admission, p.health, p.auth
    app.state.prefix_index, app.state.drain = p.prefix_index, p.drain
    app.state.models, app.state.shadow = p.router, p.shadow
    _install_proxy(app, _proxy_handler(app, p), p.drain)
    _add_own_routes(app, p)
    return app


def _make_parts(config: GatewayConfig) -> _Parts:
    """The worker pool, health, admission, auth, prefix index, metrics, drain, and the
    forwarder with its routing choice (the configured policy over the pool's candidates)."""
    pool = WorkerPool(config.workers)
    health = Health(config.health)
    admission = Admission(config.max_inflight_per_worker, config.max_queue, config.queue_timeout)
    auth = Auth(config.api_keys, config.requests_per_minute, config.tokens_per_minute)
    prefix_index = PrefixIndex(config.prefix_record_blocks, config.prefix_ttl)
    policy = _policy(config, prefix_index, pool)
    rng = random.Random()
    metrics = GatewayMetrics(pool, config.stale_after, time.monotonic, lambda: admission.queued)

    def choose(cands, req=None):
        return policy(cands, time.monotonic(), config.stale_after, rng, req)

    forwarder = Forwarder(config, pool, health, admission, metrics, choose, lambda exc: _rejected(metrics, exc))
    directory = ModelDirectory(pool, config.health.interval)
    router = ModelRouter(directory, AliasTable(config.aliases, config.models_config, config.shadow_fraction), metrics,
                         config.session_header)
    shadow = ShadowMonitor(config, directory, health, admission, metrics)
    return _Parts(config, pool, health, admission, auth, prefix_index, metrics, Drain(), forwarder, directory, router,
                  shadow)


def _policy(config: GatewayConfig, prefix_index: PrefixIndex, pool: WorkerPool):
    """The routing policy named by ``config.policy``; the prefix policy forgets removed workers."""
    if config.policy != "prefix":
        return make_policy(config.policy)
    policy = make_policy("prefix", prefix_index, block_bytes=config.prefix_block_bytes, eps=config.balance_eps,
                         floor=config.balance_floor, load_weight=config.prefix_load_weight)
    pool.on_remove.append(policy.forget)
    return policy


def _lifespan(p: _Parts):
    """Open the one pooled client (forwarding, probes, scrapes, /v1/models) and run the
    scraper, the health prober and the discovery watchers; stop them at exit."""
    config = p.config

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        client = app.state.client = upstream_session(config.connect_timeout, config.first_byte_timeout)
        tasks = [asyncio.create_task(Scraper(p.pool, client, config.scrape_interval, config.scrape_timeout).run()),
                 asyncio.create_task(p.health.run(client, lambda: p.pool)),
                 asyncio.create_task(p.directory.run(client))]
        if config.models_config:
            tasks.append(asyncio.create_task(p.router.aliases.watch()))
        if config.workers_file:
            tasks.append(asyncio.create_task(watch_file(config.workers_file, p.pool)))
        if config.k8s_service:
            tasks.append(asyncio.create_task(watch_kubernetes(config.k8s_service, config.k8s_namespace, p.pool,
                                                              config.k8s_port_name, config.k8s_port)))
        try:
            yield
        finally:
            for t in tasks:
                t.cancel()
            p.shadow.close()
            await client.close()

    return lifespan


def _route_request(config: GatewayConfig, request: Request, path: str, body: dict) -> RouteRequest | None:
    """What the prefix policy routes on (the prompt's block hashes, the session); None for other policies."""
    if config.policy != "prefix":
        return None
    data = prompt_bytes(path, body)
    session = request.headers.get(config.session_header) if config.session_header else None
    return RouteRequest(block_hashes(data, config.prefix_block_bytes, config.prefix_max_blocks), len(data),
                        session or None)


def _proxy_handler(app: FastAPI, p: _Parts):
    """``proxy(request, path)``: the request path of the module docstring, from the API key to
    the forwarder; the token charge is corrected by the usage the worker reports."""
    config, auth, metrics = p.config, p.auth, p.metrics

    async def proxy(request: Request, path: str) -> Response:
        try:
            who = auth.check(request.headers.get("authorization"))     # before reading a byte of the body
        except Rejected as exc:
            return _rejected(metrics, exc)
        try:
            raw = await read_body(request, config.max_body_bytes, config.body_timeout)
            body = parse_body(path, raw)
        except EdgeError as exc:
            metrics.rejected.labels(exc.reason).inc()
            return error(exc.status, str(exc), code=exc.reason, param=exc.param)
        try:
            routed = await p.router.route(app.state.client, path, body, raw, request.headers)
        except ModelError as exc:
            return _model_refused(metrics, exc)
        est = estimate_tokens(body)
        try:
            auth.charge(who, est)
        except Rejected as exc:
            return _rejected(metrics, exc)

        def on_usage(completion_tokens: int) -> None:
            auth.correct(who, est, est - requested_tokens(body) + completion_tokens)

        async def send(routed) -> Response:
            p.shadow.client_request()       # --shadow-yield all: running comparisons give way
            sent, upstream = routed.body, routed.raw
            tracker = tracker_for(path, sent, config.max_migrations)
            if tracker is not None:         # the worker sends token ids, so that the stream can resume elsewhere
                upstream = tracker.upstream()
            watch = p.shadow.plan(routed, path)
            response = await p.forwarder.forward(app.state.client, path, upstream, on_usage,
                                                 _route_request(config, request, path, sent), tracker, routed.pool)
            return p.shadow.watch(response, watch, app.state.client) if watch is not None else response

        async def answer() -> Response:
            response = await send(routed)
            if routed.model is not None and _model_moved(response):  # a worker changed model since the last look
                await p.directory.refresh(app.state.client)
                try:
                    response = await send(await p.router.route(app.state.client, path, body, raw, request.headers))
                except ModelError as exc:
                    return _model_refused(metrics, exc)
            return response

        return await until_client_gone(request, answer())

    return proxy


def _install_proxy(app: FastAPI, proxy, drain: Drain) -> None:
    """The proxied routes skip FastAPI's middleware and routing layers (per-request and
    per-chunk cost) through ``FastPath``; the same routes are declared for the OpenAPI schema."""
    inner_stack = app.build_middleware_stack
    app.build_middleware_stack = lambda: FastPath(inner_stack(), proxy, drain)

    def proxied(path: str):
        async def route(request: Request):
            return await proxy(request, path)
        return route

    for path in FastPath.PATHS:
        app.add_api_route(path, proxied(path), methods=["POST"], name=path.strip("/").replace("/", "_"))


def _guard(p: _Parts, flag: bool, request: Request) -> JSONResponse | None:
    """The API-key check of a gateway route that ``flag`` protects: a 401 answer, or None to go on."""
    if flag and p.auth.enabled:
        try:
            p.auth.check(request.headers.get("authorization"))
        except Rejected as exc:
            return _rejected(p.metrics, exc)
    return None


def _model_refused(m: GatewayMetrics, exc: ModelError) -> JSONResponse:
    m.rejected.labels(exc.code).inc()
    return error(exc.status, str(exc), exc.type, code=exc.code, param=exc.param,
                 headers={"Retry-After": "1"} if exc.status == 503 else None)


def _model_moved(response) -> bool:
    """A worker's 404 ``model_not_found``: it no longer serves the model it listed (restarted with another)."""
    return response.status_code == 404 and b'"model_not_found"' in (getattr(response, "body", b"") or b"")


def _add_own_routes(app: FastAPI, p: _Parts) -> None:
    """``GET /v1/models`` (each served model once, then the aliases), ``/health`` (200 only when not
    draining and a worker is routable) and ``/metrics``; the last two need a key only when configured so."""

    @app.get("/v1/models")
    async def models(request: Request):
        denied = _guard(p, True, request)
        if denied:
            return denied
        if p.directory.unlisted(time.monotonic()):
            # A worker that turned healthy since the last model refresh: list its models now, so that a
            # client that saw /health 200 never gets an empty list.
            await p.directory.refresh_shared(request.app.state.client)
        return {"object": "list", "data": p.router.listing(time.monotonic())}

    @app.get("/health")
    async def health_endpoint(request: Request):
        denied = _guard(p, p.config.protect_health, request)
        if denied:
            return denied
        now = time.monotonic()
        live = sum(w.routable(now) for w in p.pool)
        status = "draining" if p.drain.draining else "ok" if live else "unavailable"
        body = {"status": status, "routable_workers": live, "workers": len(p.pool), "queued": p.admission.queued}
        return JSONResponse(body, status_code=200 if status == "ok" else 503)

    @app.get("/metrics")
    async def metrics_endpoint(request: Request):
        denied = _guard(p, p.config.protect_metrics, request)
        if denied:
            return denied
        return Response(generate_latest(p.metrics.registry), media_type=CONTENT_TYPE_LATEST)
