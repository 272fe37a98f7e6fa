"""The gateway app: ``build_app(GatewayConfig) -> FastAPI``.

Request path: API key (401, before the body is read) -> body size and deadline (413,
408) -> JSON and required fields (400; gateway.edge) -> per-key rate limits (429) ->
admission (a worker with room, else the bounded queue, else 429; no routable worker:
503) -> forwarding (gateway.proxy: retries before the first byte, whole JSON answers,
SSE passed through; a stream whose worker fails mid-stream migrates to another worker
(gateway.failover) or, when it cannot, ends with an in-band error event). On SIGTERM
the gateway drains (gateway.shutdown: new requests 503, ``/health`` 503, in-flight ones
finish).

Every answer the gateway makes itself is OpenAI-style JSON, unknown routes (404) and
wrong methods (405) included; an unexpected exception is a JSON 500 with one log line.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from contextlib import asynccontextmanager

import aiohttp
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.admission import Admission, Rejected
from gateway.auth import Auth, estimate_tokens, requested_tokens
from gateway.config import GatewayConfig
from gateway.discovery import WorkerPool, watch_file, watch_kubernetes
from gateway.edge import EdgeError, parse_body, read_body
from gateway.errors import error
from gateway.health import Health
from gateway.metrics import GatewayMetrics
from gateway.migration import StreamTracker
from gateway.prefix import PrefixIndex, block_hashes, prompt_bytes
from gateway.routing.base import RouteRequest
from gateway.proxy import Forwarder
from gateway.routing import make_policy
from gateway.scraper import Scraper
from gateway.shutdown import Drain
from gateway.upstream import upstream_session

log = logging.getLogger(__name__)


def _rejected(m: GatewayMetrics, exc: Rejected) -> JSONResponse:
    m.rejected.labels(exc.reason).inc()
    kind = {401: "authentication_error", 429: "rate_limit_error", 503: "service_unavailable"}.get(
        exc.status, "invalid_request_error")
    headers = {"Retry-After": str(max(1, round(exc.retry_after)))} if exc.status in (429, 503) else None
    return error(exc.status, str(exc), kind, code=exc.reason, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(StarletteHTTPException)
    async def _http(_req: Request, exc: StarletteHTTPException) -> JSONResponse:
        msg = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        return error(exc.status_code, msg, "invalid_request_error" if exc.status_code < 500 else "internal_error",
                     headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _validation(_req: Request, exc: RequestValidationError) -> JSONResponse:
        return error(400, "Invalid request.")

    @app.exception_handler(Exception)
    async def _unexpected(req: Request, exc: Exception) -> JSONResponse:
        log.error("unhandled %s on %s %s: %s", type(exc).__name__, req.method, req.url.path, exc)
        return error(500, f"Internal gateway error: {type(exc).__name__}", "internal_error")


class FastPath:
    """ASGI: the proxied ``POST`` routes (``PATHS``) straight to ``handler``
    (an unexpected exception is a JSON 500, as in the app's handler); the rest to ``app``."""

    PATHS = ("/v1/completions", "/v1/chat/completions", "/v1/responses", "/tokenize", "/detokenize")

    def __init__(self, app, handler, drain: Drain) -> None:
        self.app, self.handler, self.drain = app, handler, drain

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in self.PATHS:
            return await self.app(scope, receive, send)
        if self.drain.draining:         # gateway.shutdown: another replica takes it
            response = error(503, "The gateway is shutting down; retry.", "service_unavailable",
                             code="shutting_down", headers={"Retry-After": "1"})
            return await response(scope, receive, send)
        self.drain.in_flight += 1
        try:
            try:
                response = await self.handler(Request(scope, receive), scope["path"])
            except Exception as exc:  # noqa: BLE001 - the client gets JSON, the log one line
                log.error("unhandled %s on POST %s: %s", type(exc).__name__, scope["path"], exc)
                response = error(500, f"Internal gateway error: {type(exc).__name__}", "internal_error")
            await response(scope, receive, send)
        finally:
            self.drain.in_flight -= 1


def build_app(config: GatewayConfig) -> FastAPI:
    pool = WorkerPool(config.workers)
    health = Health(config.health)
    admission = Admission(config.max_inflight_per_worker, config.max_queue, config.queue_timeout)
    auth = Auth(config.api_keys, config.requests_per_minute, config.tokens_per_minute)
    prefix_index = PrefixIndex(config.prefix_record_blocks, config.prefix_ttl)
    if config.policy == "prefix":
        policy = make_policy("prefix", prefix_index, block_bytes=config.prefix_block_bytes, eps=config.balance_eps,
                             floor=config.balance_floor, load_weight=config.prefix_load_weight)
        pool.on_remove.append(policy.forget)
    else:
        policy = make_policy(config.policy)
    rng = random.Random()
    metrics = GatewayMetrics(pool, config.stale_after, time.monotonic, lambda: admission.queued)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        # one pooled client: forwarding, probes, scrapes and /v1/models
        client = app.state.client = upstream_session(config.connect_timeout, config.first_byte_timeout)
        tasks = [asyncio.create_task(Scraper(pool, client, config.scrape_interval, config.scrape_timeout).run()),
                 asyncio.create_task(health.run(client, lambda: pool))]
        if config.workers_file:
            tasks.append(asyncio.create_task(watch_file(config.workers_file, pool)))
        if config.k8s_service:
            tasks.append(asyncio.create_task(watch_kubernetes(config.k8s_service, config.k8s_namespace, pool,
                                                              config.k8s_port_name, config.k8s_port)))
        try:
            yield
        finally:
            for t in tasks:
                t.cancel()
            await client.close()

    app = FastAPI(title="SwiftServe gateway", lifespan=lifespan)
    install_error_handlers(app)
    app.state.config, app.state.pool, app.state.metrics = config, pool, metrics
    app.state.admission, app.state.health, app.state.auth = admission, health, auth
    app.state.prefix_index = prefix_index
    drain = app.state.drain = Drain()

    def choose(cands, req=None):
        return policy(cands, time.monotonic(), config.stale_after, rng, req)

    def route_request(request: Request, path: str, body: dict) -> RouteRequest | None:
        if config.policy != "prefix":
            return None
        data = prompt_bytes(path, body)
        session = request.headers.get(config.session_header) if config.session_header else None
        return RouteRequest(block_hashes(data, config.prefix_block_bytes, config.prefix_max_blocks), len(data),
                            session or None)

    forwarder = Forwarder(config, pool, health, admission, metrics, choose, lambda exc: _rejected(metrics, exc))

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
        est = estimate_tokens(body)
        try:
            auth.charge(who, est)
        except Rejected as exc:
            return _rejected(metrics, exc)

        def on_usage(completion_tokens: int) -> None:
            auth.correct(who, est, est - requested_tokens(body) + completion_tokens)

        tracker = StreamTracker.for_request(path, body, config.max_migrations)
        if tracker is not None:         # the worker sends token ids, so that the stream can resume elsewhere
            raw = tracker.upstream()
        return await forwarder.forward(app.state.client, path, raw, on_usage, route_request(request, path, body),
                                       tracker)

    def guard(flag: bool, request: Request) -> JSONResponse | None:
        if flag and auth.enabled:
            try:
                auth.check(request.headers.get("authorization"))
            except Rejected as exc:
                return _rejected(metrics, exc)
        return None

    # The proxied routes skip FastAPI's middleware and routing layers (per-request and
    # per-chunk cost); the routes below stay for the OpenAPI schema.
    inner_stack = app.build_middleware_stack
    app.build_middleware_stack = lambda: FastPath(inner_stack(), proxy, drain)

    def proxied(path: str):
        async def route(request: Request):
            return await proxy(request, path)
        return route

    for path in FastPath.PATHS:
        app.add_api_route(path, proxied(path), methods=["POST"], name=path.strip("/").replace("/", "_"))

    @app.get("/v1/models")
    async def models(request: Request):
        denied = guard(True, request)
        if denied:
            return denied
        seen, data = set(), []
        for w in pool:
            if not w.routable(time.monotonic()):
                continue
            try:
                async with app.state.client.get(w.url + "/v1/models", timeout=aiohttp.ClientTimeout(total=5)) as r:
                    doc = await r.json(content_type=None)
                for item in doc.get("data", []):
                    if item.get("id") not in seen:
                        seen.add(item.get("id"))
                        data.append(item)
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, AttributeError):
                continue
        return {"object": "list", "data": data}

    @app.get("/health")
    async def health_endpoint(request: Request):
        denied = guard(config.protect_health, request)
        if denied:
            return denied
        now = time.monotonic()
        live = sum(w.routable(now) for w in pool)
        status = "draining" if drain.draining else "ok" if live else "unavailable"
        body = {"status": status, "routable_workers": live, "workers": len(pool), "queued": admission.queued}
        return JSONResponse(body, status_code=200 if status == "ok" else 503)

    @app.get("/metrics")
    async def metrics_endpoint(request: Request):
        denied = guard(config.protect_metrics, request)
        if denied:
            return denied
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
