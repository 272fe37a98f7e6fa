"""Fake vLLM-like workers (real HTTP servers in threads) for gateway tests."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from benchmarks.lib.procs import free_port


class FakeWorker:
    """Serves ``model`` (``/v1/models``; other names get the worker's 404 ``model_not_found``) and answers
    ``text`` (non-streamed; streams send ``chunks`` events of "tok"); ``requests`` keeps each body's model."""

    def __init__(self, name: str, delay: float = 0.0, chunks: int = 3, reported_queue: int = 0, status: int = 200,
                 model: str = "m", text: str = "ok"):
        self.name, self.delay, self.chunks, self.reported_queue = name, delay, chunks, reported_queue
        self.status, self.model, self.text = status, model, text
        self.requests: list[str] = []
        self.active = 0
        self.served = 0
        self.cancelled = 0
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        app = FastAPI()

        @app.get("/metrics")
        async def metrics():
            q = self.reported_queue
            return PlainTextResponse(f'vllm:num_requests_running{{model_name="m"}} {float(q)}\n'
                                     f'vllm:num_requests_waiting{{model_name="m"}} 0.0\n'
                                     f'vllm:kv_cache_usage_perc{{model_name="m"}} 0.25\n')

        @app.get("/health")
        async def health():
            return PlainTextResponse("")

        @app.get("/v1/models")
        async def models():
            return {"object": "list", "data": [{"id": self.model, "object": "model"}]}

        @app.post("/v1/completions")
        async def completions(request: Request):
            body = await request.json()
            self.requests.append(body.get("model"))
            if body.get("model") != self.model:
                return JSONResponse({"error": {"message": f"The model `{body.get('model')}` does not exist.",
                                               "type": "invalid_request_error", "code": "model_not_found"}},
                                    status_code=404)
            self.served += 1
            if self.status != 200:
                return JSONResponse({"error": {"message": "boom"}}, status_code=self.status)
            self.active += 1
            if not body.get("stream"):
                try:
                    await asyncio.sleep(self.delay)
                    return JSONResponse({"worker": self.name, "model": self.model,
                                         "choices": [{"index": 0, "text": self.text, "finish_reason": "stop"}]})
                finally:
                    self.active -= 1

            async def gen():
                try:
                    for i in range(self.chunks):
                        await asyncio.sleep(self.delay)
                        yield f"data: {json.dumps({'worker': self.name, 'i': i, 'choices': [{'text': 'tok'}]})}\n\n"
                    yield f"data: {json.dumps({'choices': [], 'usage': {'completion_tokens': self.chunks}})}\n\n"
                    yield "data: [DONE]\n\n"
                except asyncio.CancelledError:
                    self.cancelled += 1
                    raise
                finally:
                    self.active -= 1

            return StreamingResponse(gen(), media_type="text/event-stream")

        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> "FakeWorker":
        self.thread.start()
        deadline = time.time() + 10
        while not self.server.started:
            if time.time() > deadline:
                raise RuntimeError("fake worker did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(5)
