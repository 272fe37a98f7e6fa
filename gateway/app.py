"""The gateway app: ``build_app(GatewayConfig) -> FastAPI``.

Request path: size check (413) -> JSON and required fields (400) -> API key (401) ->
per-key rate limits (429) -> admission (a worker with room, else the bounded queue,
else 429; no routable worker: 503) -> proxy. The worker's status, headers and body
stream through unchanged, chunk by chunk (SSE untouched).

Failover: a connection error, a timeout before the first byte, or a 5xx status
before any byte reached the client is retried on another worker (``max_attempts``).
After the first byte nothing is retried, so a streamed answer is never duplicated.

Accounting: a worker's in-flight count rises at dispatch and falls in the response's
cleanup, which runs however the response ends (completed, failed, client gone);
closing the upstream stream is what tells the worker to abort.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.admission import Admission, Rejected
from gateway.auth import Auth, estimate_tokens
from gateway.config import GatewayConfig
from gateway.discovery import WorkerPool, watch_file, watch_kubernetes
from gateway.errors import error
from gateway.health import Health
from gateway.metrics import GatewayMetrics
from gateway.routing import make_policy
from gateway.scraper import Scraper
from gateway.streaming import StreamStats

log = logging.getLogger(__name__)
HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding"}
RETRYABLE = (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError, httpx.ReadError,
             httpx.ReadTimeout, asyncio.TimeoutError)


class ProxiedStream(StreamingResponse):
    """A streamed upstream response whose cleanup runs however the response ends."""

    def __init__(self, content, on_close, **kw):
        super().__init__(content, **kw)
        self._on_close = on_close

    async def __call__(self, scope, receive, send):
        ok = False
        try:
            await super().__call__(scope, receive, send)
            ok = True
        finally:
            await self._on_close(ok)


def _rejected(m: GatewayMetrics, exc: Rejected) -> JSONResponse:
    m.rejected.labels(exc.reason).inc()
    kind = {401: "authentication_error", 429: "rate_limit_error", 503: "service_unavailable"}.get(
        exc.status, "invalid_request_error")
    headers = {"Retry-After": str(max(1, round(exc.retry_after)))} if exc.status in (429, 503) else None
    return error(exc.status, str(exc), kind, code=exc.reason, headers=headers)


def _validate(path: str, body: dict) -> str | None:
    if not isinstance(body.get("model"), str) or not body.get("model"):
        return "model"
    if path.endswith("/chat/completions"):
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            return "messages"
    elif body.get("prompt") in (None, "", []):
        return "prompt"
    return None


def build_app(config: GatewayConfig) -> FastAPI:
    pool = WorkerPool(config.workers)
    health = Health(config.health)
    admission = Admission(config.max_inflight_per_worker, config.max_queue, config.queue_timeout)
    auth = Auth(config.api_keys, config.requests_per_minute, config.tokens_per_minute)
    policy = make_policy(config.policy)
    rng = random.Random()
    metrics = GatewayMetrics(pool, config.stale_after, time.monotonic, lambda: admission.queued)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        limits = httpx.Limits(max_connections=2000, max_keepalive_connections=500)
        timeout = httpx.Timeout(connect=config.connect_timeout, read=config.first_byte_timeout, write=30, pool=30)
        client = app.state.client = httpx.AsyncClient(limits=limits, timeout=timeout)
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
            await client.aclose()

    app = FastAPI(title="SwiftServe gateway", lifespan=lifespan)
    app.state.config, app.state.pool, app.state.metrics = config, pool, metrics
    app.state.admission, app.state.health, app.state.auth = admission, health, auth

    def choose(cands):
        return policy(cands, time.monotonic(), config.stale_after, rng)

    async def proxy(request: Request, path: str) -> Response:
        m = metrics
        endpoint = path.rsplit("/", 1)[-1]
        raw = await request.body()
        if len(raw) > config.max_body_bytes:
            m.rejected.labels("body_too_large").inc()
            return error(413, f"Request body exceeds {config.max_body_bytes} bytes.", code="body_too_large")
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            m.rejected.labels("bad_json").inc()
            return error(400, "We could not parse the JSON body of your request.")
        if not isinstance(body, dict):
            m.rejected.labels("bad_json").inc()
            return error(400, "The request body must be a JSON object.")
        missing = _validate(path, body)
        if missing:
            m.rejected.labels("invalid_request").inc()
            return error(400, f"Missing or invalid required parameter: '{missing}'.", param=missing)
        est = estimate_tokens(body)
        try:
            who = auth.check(request.headers.get("authorization"))
            auth.charge(who, est)
        except Rejected as exc:
            return _rejected(m, exc)
        t0 = time.monotonic()
        tried: set[str] = set()
        last_error = ""
        for attempt in range(config.max_attempts):
            try:
                worker = await admission.acquire(lambda: pool, choose, tried)
            except Rejected as exc:
                if attempt and exc.reason == "no_worker":
                    break
                return _rejected(m, exc)
            tried.add(worker.url)
            m.routed.labels(config.policy, worker.url).inc()
            worker.in_flight += 1
            health.on_dispatch(worker, time.monotonic())
            done = False

            def finish(ok: bool, w=worker):
                nonlocal done
                if not done:
                    done = True
                    w.in_flight -= 1
                    health.on_result(w, ok)
                    admission.release()
                    pool.reap()

            try:
                up = app.state.client.build_request("POST", worker.url + path, content=raw,
                                                    headers={"content-type": "application/json"})
                resp = await app.state.client.send(up, stream=True)
                chunks = resp.aiter_raw()
                try:
                    first = await asyncio.wait_for(chunks.__anext__(), config.first_byte_timeout)
                except StopAsyncIteration:
                    first = b""
            except RETRYABLE as exc:
                finish(False)
                last_error = f"{type(exc).__name__} from {worker.url}"
                m.retries.labels(type(exc).__name__).inc()
                continue
            except BaseException:
                finish(False)
                raise
            if resp.status_code >= 500 and attempt + 1 < config.max_attempts:
                await resp.aclose()
                finish(False)
                last_error = f"HTTP {resp.status_code} from {worker.url}"
                m.retries.labels(f"http_{resp.status_code}").inc()
                continue
            stats = StreamStats(t0)
            stats.feed(first)
            headers = {k: v for k, v in resp.headers.items() if k.lower() not in HOP_HEADERS}

            async def body_iter(chunks=chunks, first=first, stats=stats):
                if first:
                    yield first
                async for chunk in chunks:
                    stats.feed(chunk)
                    yield chunk

            async def on_close(sent_ok: bool, resp=resp, stats=stats, finish=finish):
                ok = sent_ok and resp.status_code < 500
                finish(ok)
                m.requests.labels(endpoint, str(resp.status_code)).inc()
                if sent_ok:
                    m.e2e.observe(time.monotonic() - t0)
                    if stats.ttft is not None:
                        m.ttft.observe(stats.ttft)
                    if stats.tpot is not None:
                        m.tpot.observe(stats.tpot)
                    if stats.completion_tokens is not None:
                        auth.correct(who, est, est - float(body.get("max_tokens") or 16) + stats.completion_tokens)
                await resp.aclose()          # closing the upstream stream makes the worker abort

            return ProxiedStream(body_iter(), on_close, status_code=resp.status_code, headers=headers,
                                 media_type=resp.headers.get("content-type"))
        m.rejected.labels("no_worker").inc()
        return error(503, f"No worker could take the request ({last_error or 'none routable'}).",
                     "service_unavailable", code="no_worker", headers={"Retry-After": "1"})

    def guard(flag: bool, request: Request) -> JSONResponse | None:
        if flag and auth.enabled:
            try:
                auth.check(request.headers.get("authorization"))
            except Rejected as exc:
                return _rejected(metrics, exc)
        return None

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await proxy(request, "/v1/completions")

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await proxy(request, "/v1/chat/completions")

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
                r = await app.state.client.get(w.url + "/v1/models", timeout=5)
                for item in r.json().get("data", []):
                    if item.get("id") not in seen:
                        seen.add(item.get("id"))
                        data.append(item)
            except (httpx.HTTPError, ValueError):
                continue
        return {"object": "list", "data": data}

    @app.get("/health")
    async def health_endpoint(request: Request):
        denied = guard(config.protect_health, request)
        if denied:
            return denied
        now = time.monotonic()
        live = sum(w.routable(now) for w in pool)
        body = {"status": "ok" if live else "unavailable", "routable_workers": live, "workers": len(pool),
                "queued": admission.queued}
        return JSONResponse(body, status_code=200 if live else 503)

    @app.get("/metrics")
    async def metrics_endpoint(request: Request):
        denied = guard(config.protect_metrics, request)
        if denied:
            return denied
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
