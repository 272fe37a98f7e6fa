"""``build_app(config, engine, tokenizer)``: the worker's FastAPI app (vllm serve's surface).

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``POST /v1/responses``
(stateless Responses API), ``POST /tokenize`` and ``POST /detokenize`` (vLLM's shapes), ``GET /v1/models``
(with ``max_model_len``), ``GET /health`` (200 when the engine is healthy and the worker is not
draining, else 503), ``GET /load`` (running / waiting / in-flight / KV usage, for routers; its
``server_load`` is vLLM's field: generation HTTP requests in flight), ``GET /get_load`` (the
per-rank list that SGLang-style routers poll: ``dp_rank``, ``num_reqs``, ``num_waiting_reqs``,
``num_tokens`` = tokens held in the KV cache),
``GET /metrics`` (Prometheus, per-app registry), ``GET /version``.

Shared objects live on ``app.state`` (``config``, ``engine``, ``tokenizer``,
``serving``: a ``worker.serving.ServingState``); nothing is global, so two apps
can live in one process. The lifespan starts the engine before the first request
is served and shuts it down at exit.
"""

from __future__ import annotations

import time
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST

from swiftcommon.version import __version__
from worker.config import WorkerConfig
from worker.engine_client import EngineClient
from worker.errors import APIError, error_response, install_error_handlers
from worker.limits import BodyLimit
from worker.api.chat.protocol import ChatCompletionRequest
from worker.api.chat.serving import create_chat_completion
from worker.api.choice_models import ChatCompletionResponse, CompletionResponse
from worker.api.completions.protocol import CompletionRequest
from worker.api.completions.serving import create_completion
from worker.api.responses.protocol import ResponsesRequest
from worker.api.responses.serving import create_response
from worker.api.tokenize.protocol import DetokenizeRequest, TokenizeRequest
from worker.api.tokenize.serving import detokenize, tokenize
from worker.request_body import CountedRoute
from worker.serving import ServingState


def build_app(config: WorkerConfig, engine: EngineClient, tokenizer) -> FastAPI:
    state = ServingState(config, engine, tokenizer)
    app = FastAPI(title="SwiftServe worker", version=__version__, lifespan=_lifespan(engine, state))
    app.state.config = config
    app.state.engine = engine
    app.state.tokenizer = tokenizer
    app.state.serving = state
    app.state.started = int(time.time())     # /v1/models' "created"; reset when the engine starts
    install_error_handlers(app)
    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes)
    _add_generation_routes(app)
    _add_status_routes(app)
    return app


def _lifespan(engine: EngineClient, state: ServingState):
    """Start the engine before the first request; at exit shut it down, then the tokenizer executor."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.started = int(time.time())
        await engine.start()
        try:
            yield
        finally:
            try:
                await engine.shutdown()
            finally:
                state.close()

    return lifespan


def _add_generation_routes(app: FastAPI) -> None:
    """The OpenAI routes and vLLM's /tokenize and /detokenize; each reads ``app.state.serving``. The OpenAI
    routes' bodies are parsed once and counted before validation (``worker.request_body``)."""
    router = APIRouter(route_class=CountedRoute)

    @router.post("/v1/completions", response_model=CompletionResponse)
    async def completions(request: CompletionRequest, raw_request: Request):
        return await create_completion(raw_request.app.state.serving, request, raw_request)

    @router.post("/v1/chat/completions", response_model=ChatCompletionResponse)
    async def chat_completions(request: ChatCompletionRequest, raw_request: Request):
        return await create_chat_completion(raw_request.app.state.serving, request, raw_request)

    @router.post("/v1/responses")
    async def responses(request: ResponsesRequest, raw_request: Request):
        return await create_response(raw_request.app.state.serving, request, raw_request)

    app.include_router(router)

    @app.post("/tokenize")
    async def tokenize_route(request: TokenizeRequest, raw_request: Request):
        return await tokenize(raw_request.app.state.serving, request)

    @app.post("/detokenize")
    async def detokenize_route(request: DetokenizeRequest, raw_request: Request):
        return await detokenize(raw_request.app.state.serving, request)


def _add_status_routes(app: FastAPI) -> None:
    """/v1/models, /health, /load, /get_load, /metrics, /version: read from ``app.state``, cheap."""

    @app.get("/v1/models")
    async def models(raw_request: Request):
        st = raw_request.app.state
        created = st.started
        data = [{"id": name, "object": "model", "created": created, "owned_by": "swiftserve",
                 "root": st.config.model_dir, "parent": None, "max_model_len": st.engine.max_model_len,
                 "permission": []} for name in st.config.model_names]
        return {"object": "list", "data": data}

    @app.get("/health")
    async def health(raw_request: Request):
        st = raw_request.app.state
        if st.serving.draining:
            return error_response(APIError(503, "The worker is shutting down.", code="shutting_down"))
        if st.engine.healthy():
            return Response(status_code=200)
        return error_response(APIError(503, "The engine is not healthy.", code="engine_unavailable"))

    @app.get("/load")
    async def load(raw_request: Request):
        st = raw_request.app.state
        s = st.engine.stats()
        return JSONResponse({
            "server_load": st.serving.in_flight,
            "model": st.config.model_name,
            "running": s.num_running, "waiting": s.num_waiting, "in_flight": st.serving.in_flight,
            "max_concurrent_requests": st.config.max_concurrent_requests,
            "kv_usage": s.kv_usage, "kv_blocks_used": s.kv_blocks_used, "kv_blocks_total": s.kv_blocks_total,
            "num_preemptions": s.num_preemptions, "healthy": st.engine.healthy(), "draining": st.serving.draining,
        })

    @app.get("/get_load")
    async def get_load(raw_request: Request):
        st = raw_request.app.state
        s = st.engine.stats()
        return JSONResponse([{"dp_rank": 0, "num_reqs": s.num_running + s.num_waiting, "num_waiting_reqs": s.num_waiting,
                              "num_tokens": s.kv_blocks_used * s.kv_block_size}])

    @app.get("/metrics")
    async def metrics(raw_request: Request):
        return Response(raw_request.app.state.serving.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/version")
    async def version(raw_request: Request):
        cfg = raw_request.app.state.config
        return {"version": __version__, "engine": cfg.engine, "model": cfg.model_name, **cfg.extra}
