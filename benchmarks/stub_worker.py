"""A stub OpenAI-style streaming worker for gateway benchmarks (no model).

    python benchmarks/stub_worker.py --port 9001 --ttft 0 --itl 0 --tokens 5
    python benchmarks/stub_worker.py --port 9002 --ttft 0.2 --itl 0.02 --serial   # one request at a time

``--serial`` serves one request at a time (a queue forms, as in an engine at capacity)
and reports it through vLLM's queue metrics so the gateway can see it.
"""

from __future__ import annotations

import argparse
import asyncio
import json

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse


def build(ttft: float, itl: float, tokens: int, serial: bool) -> FastAPI:
    app = FastAPI()
    lock = asyncio.Lock()
    state = {"running": 0, "waiting": 0}

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(f"vllm:num_requests_running {state['running']}\n"
                                 f"vllm:num_requests_waiting {state['waiting']}\nvllm:kv_cache_usage_perc 0.1\n")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "stub", "object": "model"}]}

    async def produce():
        if ttft:
            await asyncio.sleep(ttft)
        for i in range(tokens):
            if i and itl:
                await asyncio.sleep(itl)
            yield "data: " + json.dumps({"choices": [{"index": 0, "text": " x"}]}) + "\n\n"
        yield "data: " + json.dumps({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": tokens}}) + "\n\n"
        yield "data: [DONE]\n\n"

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()

        async def gen():
            state["waiting"] += 1
            if serial:
                await lock.acquire()
            state["waiting"] -= 1
            state["running"] += 1
            try:
                async for c in produce():
                    yield c
            finally:
                state["running"] -= 1
                if serial:
                    lock.release()

        if body.get("stream"):
            return StreamingResponse(gen(), media_type="text/event-stream")
        async for _ in gen():
            pass
        return JSONResponse({"choices": [{"index": 0, "text": " x" * tokens}],
                             "usage": {"prompt_tokens": 1, "completion_tokens": tokens}})

    return app


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--ttft", type=float, default=0.0)
    ap.add_argument("--itl", type=float, default=0.0)
    ap.add_argument("--tokens", type=int, default=5)
    ap.add_argument("--serial", action="store_true")
    a = ap.parse_args()
    uvicorn.run(build(a.ttft, a.itl, a.tokens, a.serial), host="127.0.0.1", port=a.port, log_level="warning",
                access_log=False)
