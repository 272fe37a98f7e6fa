"""A fake OpenAI-compatible streaming server (real HTTP, thread) for load-test tests."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from benchmarks.lib.procs import free_port


class FakeOpenAI:
    def __init__(self, ttft: float = 0.02, itl: float = 0.005):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.bodies: list[dict] = []
        app = FastAPI()

        @app.get("/v1/models")
        async def models():
            return {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}

        @app.post("/v1/completions")
        async def completions(request: Request):
            body = await request.json()
            self.bodies.append(body)
            n = body["max_tokens"]
            prompt_tokens = len(body["prompt"]) if isinstance(body["prompt"], list) else 3

            async def gen():
                await asyncio.sleep(ttft)
                for i in range(n):
                    if i:
                        await asyncio.sleep(itl)
                    yield "data: " + json.dumps({"choices": [{"index": 0, "text": f" t{i}"}]}) + "\n\n"
                yield "data: " + json.dumps({"choices": [], "usage": {"prompt_tokens": prompt_tokens,
                                                                      "completion_tokens": n}}) + "\n\n"
                yield "data: [DONE]\n\n"

            return StreamingResponse(gen(), media_type="text/event-stream")

        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        while not self.server.started:
            time.sleep(0.02)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(5)
