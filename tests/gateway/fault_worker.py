"""A vLLM-like worker process whose faults a test switches at run time (no model).

    python tests/gateway/fault_worker.py --port 9001 --name a

``POST /_fault`` sets the behaviour of the next generation requests (JSON fields, all
optional): ``mode`` = ``ok`` | ``hang`` (accept, never answer) | ``error500`` |
``request_fault500`` (a 500 marked as the request's own fault, ``swiftcommon.faults``) |
``error400`` (a 400, as for a request the worker refuses) |
``garbage`` (200 with a body that is not JSON; for streams, an event that is not JSON) |
``no_done`` (a stream that ends without its finish and ``[DONE]``) |
``die_mid_body`` (a non-streamed answer cut after its first bytes: the process exits);
``first_delay`` (s before the first byte), ``token_delay`` (s between events),
``tokens`` (events per stream), ``queue`` (reported ``vllm:num_requests_waiting``).
``GET /_stats`` returns ``{"active", "served", "cancelled"}``; ``active`` counts the
generation requests in progress, so a test can kill the process while it holds one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse


def build(name: str) -> FastAPI:
    app = FastAPI()
    fault = {"mode": "ok", "first_delay": 0.0, "token_delay": 0.01, "tokens": 5, "queue": 0}
    stats = {"active": 0, "served": 0, "cancelled": 0}

    @app.post("/_fault")
    async def set_fault(request: Request):
        fault.update(await request.json())
        return fault

    @app.get("/_stats")
    async def get_stats():
        return stats

    @app.get("/health")
    async def health():
        return PlainTextResponse("")

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(f"vllm:num_requests_running {stats['active']}\n"
                                 f"vllm:num_requests_waiting {fault['queue']}\nvllm:kv_cache_usage_perc 0.1\n")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "m", "object": "model"}]}

    def event(obj) -> str:
        return f"data: {json.dumps(obj)}\n\n"

    async def generate(request: Request, stream: bool):
        mode, n = fault["mode"], int(fault["tokens"])
        if mode == "hang":
            await asyncio.sleep(3600)
        await asyncio.sleep(fault["first_delay"])
        if mode == "error500":
            return JSONResponse({"error": {"message": "boom", "type": "internal_error"}}, status_code=500)
        if mode == "error400":
            return JSONResponse({"error": {"message": "bad request", "type": "invalid_request_error"}}, status_code=400)
        if mode == "request_fault500":
            return JSONResponse({"error": {"message": "this request failed alone", "type": "internal_error",
                                           "code": "engine_request_failed"}}, status_code=500,
                                headers={"x-swiftserve-fault": "request"})
        if mode == "die_mid_body" and not stream:
            async def cut():
                yield b'{"id": "x", "choices": [{"te'
                await asyncio.sleep(0.05)
                os._exit(1)
            return StreamingResponse(cut(), media_type="application/json")
        if not stream:
            if mode == "garbage":
                return Response(b"<html>not json", media_type="application/json")
            await asyncio.sleep(fault["token_delay"] * n)
            return JSONResponse({"worker": name, "choices": [{"index": 0, "text": "tok" * n, "finish_reason": "length"}],
                                 "usage": {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}})

        async def events():
            try:
                for i in range(n):
                    if i:
                        await asyncio.sleep(fault["token_delay"])
                    yield event({"worker": name, "choices": [{"index": 0, "text": "tok", "finish_reason": None}]})
                if mode == "garbage":
                    yield "data: {not json\n\n"
                    return
                if mode == "no_done":
                    return
                yield event({"worker": name, "choices": [{"index": 0, "text": "", "finish_reason": "length"}]})
                yield event({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}})
                yield "data: [DONE]\n\n"
            except asyncio.CancelledError:
                stats["cancelled"] += 1
                raise

        return StreamingResponse(events(), media_type="text/event-stream")

    async def handle(request: Request):
        body = await request.json()
        stats["active"] += 1
        stats["served"] += 1
        try:
            resp = await generate(request, bool(body.get("stream")))
        except BaseException:
            stats["active"] -= 1
            raise
        if isinstance(resp, StreamingResponse):
            inner = resp.body_iterator

            async def counted():
                try:
                    async for chunk in inner:
                        yield chunk
                finally:
                    stats["active"] -= 1
            resp.body_iterator = counted()
        else:
            stats["active"] -= 1
        return resp

    app.post("/v1/completions")(handle)
    app.post("/v1/chat/completions")(handle)
    return app


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--name", default="w")
    a = ap.parse_args()
    uvicorn.run(build(a.name), host="127.0.0.1", port=a.port, log_level="warning", access_log=False)
