"""The gateway app: ``build_app(GatewayConfig) -> FastAPI``.

Generation requests are validated lightly (JSON object, size), routed by the policy,
and proxied with the worker's status, headers and body streamed through chunk by chunk
(SSE untouched). A connection failure before any byte reached the client is retried
on another worker; after the first byte nothing is retried, so a streamed answer is
never duplicated. The in-flight count of a worker is incremented at dispatch and
decremented in ``finally`` when the response ends, fails, or the client goes away
(closing the upstream stream tells the worker to abort).
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

from gateway.config import GatewayConfig
from gateway.errors import error
from gateway.metrics import GatewayMetrics
from gateway.routing import WorkerState, make_policy
from gateway.scraper import Scraper

log = logging.getLogger(__name__)
HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding"}


class ProxiedStream(StreamingResponse):
    """A streamed upstream response whose cleanup runs however the response ends:
    completed, failed, or abandoned by a disconnected client."""

    def __init__(self, content, on_close, **kw):
        super().__init__(content, **kw)
        self._on_close = on_close

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._on_close()


def build_app(config: GatewayConfig) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        limits = httpx.Limits(max_connections=1000, max_keepalive_connections=200)
        timeout = httpx.Timeout(connect=config.connect_timeout, read=config.first_byte_timeout, write=30, pool=30)
        app.state.client = httpx.AsyncClient(limits=limits, timeout=timeout)
        scraper = Scraper(app.state.workers, app.state.client, config.scrape_interval, config.scrape_timeout)
        task = asyncio.create_task(scraper.run())
        try:
            yield
        finally:
            task.cancel()
            await app.state.client.aclose()

    app = FastAPI(title="SwiftServe gateway", lifespan=lifespan)
    app.state.config = config
    app.state.workers = [WorkerState(u.rstrip("/")) for u in config.workers]
    app.state.policy = make_policy(config.policy)
    app.state.rng = random.Random()
    app.state.metrics = GatewayMetrics(app.state.workers, config.stale_after, time.monotonic)

    async def proxy(request: Request, path: str) -> Response:
        m = app.state.metrics
        raw = await request.body()
        if len(raw) > config.max_body_bytes:
            m.rejected.labels("body_too_large").inc()
            return error(413, f"request body exceeds {config.max_body_bytes} bytes")
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            m.rejected.labels("bad_json").inc()
            return error(400, "We could not parse the JSON body of your request.")
        if not isinstance(body, dict):
            return error(400, "The request body must be a JSON object.")
        t0 = time.monotonic()
        tried: set[str] = set()
        last_exc: Exception | None = None
        for _attempt in range(config.max_attempts):
            candidates = [w for w in app.state.workers if w.url not in tried]
            worker = app.state.policy(candidates, time.monotonic(), config.stale_after, app.state.rng)
            if worker is None:
                break
            tried.add(worker.url)
            m.routed.labels(config.policy, worker.url).inc()
            worker.in_flight += 1
            released = False

            def release(w=worker):
                nonlocal released
                if not released:
                    released = True
                    w.in_flight -= 1

            try:
                up = app.state.client.build_request("POST", worker.url + path, content=raw,
                                                    headers={"content-type": "application/json"})
                resp = await app.state.client.send(up, stream=True)
                # Read the first chunk here: until a byte reaches the client, failing over is safe;
                # and a started generator is always finalised (its ``finally`` runs) even if the
                # client vanishes before the response is sent.
                chunks = resp.aiter_raw()
                try:
                    first = await chunks.__anext__()
                except StopAsyncIteration:
                    first = b""
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError, httpx.ReadError) as exc:
                release()
                last_exc = exc
                m.retries.labels(type(exc).__name__).inc()
                worker.healthy = worker.healthy and not isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout))
                continue
            except BaseException:
                release()
                raise
            m.ttft.observe(time.monotonic() - t0)
            headers = {k: v for k, v in resp.headers.items() if k.lower() not in HOP_HEADERS}
            endpoint = path.rsplit("/", 1)[-1]

            async def body_iter(chunks=chunks, first=first):
                if first:
                    yield first
                async for chunk in chunks:
                    yield chunk
                m.e2e.observe(time.monotonic() - t0)

            async def on_close(resp=resp, release=release, endpoint=endpoint):
                release()
                m.requests.labels(endpoint, str(resp.status_code)).inc()
                await resp.aclose()      # closing the upstream stream makes the worker abort

            return ProxiedStream(body_iter(), on_close, status_code=resp.status_code, headers=headers,
                                 media_type=resp.headers.get("content-type"))
        m.rejected.labels("no_worker").inc()
        detail = f" (last error: {last_exc!r})" if last_exc else ""
        return error(503, f"No healthy worker could take the request{detail}.", "service_unavailable",
                     code="no_worker", headers={"Retry-After": "1"})

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await proxy(request, "/v1/completions")

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await proxy(request, "/v1/chat/completions")

    @app.get("/v1/models")
    async def models():
        seen, data = set(), []
        for w in app.state.workers:
            if not w.healthy:
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
    async def health():
        live = sum(w.healthy for w in app.state.workers)
        body = {"status": "ok" if live else "unavailable", "healthy_workers": live,
                "workers": len(app.state.workers)}
        return JSONResponse(body, status_code=200 if live else 503)

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
