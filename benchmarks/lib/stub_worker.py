"""A stub OpenAI-style streaming worker for gateway benchmarks (no model).

    python -m benchmarks.lib.stub_worker --port 9001 --ttft 0 --itl 0 --tokens 5
    python -m benchmarks.lib.stub_worker --port 9002 --ttft 0.2 --itl 0.02 --serial   # one request at a time
    python -m benchmarks.lib.stub_worker --port 9003 --prefill-per-token 0.0002 --cache-tokens 4096

``--serial`` serves one request at a time (a queue forms, as in an engine at capacity)
and reports it through vLLM's queue metrics so the gateway can see it.

``--prefill-per-token S`` models a compute-bound prefill with a prefix cache: prompts
(token-id lists, or text counted in words) are prefilled one request at a time, and a
prefill takes ``S`` x the tokens *not* found in the cache. The cache is an LRU of
``--cache-tokens`` tokens in blocks of ``--block-tokens`` (chained block hashes, full
blocks only, as vLLM's automatic prefix caching). It exports vLLM's prefix-cache
counters and ``vllm:cache_config_info``; ``GET /_stats`` returns requests served and
token counts. Decode (``--itl`` per token) runs concurrently.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections import OrderedDict

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse


class PrefixCache:
    def __init__(self, tokens: int, block: int) -> None:
        self.block, self.capacity = block, max(0, tokens // block)
        self.blocks: OrderedDict[int, None] = OrderedDict()

    def lookup_and_fill(self, ids: list) -> int:
        """Tokens of ``ids`` already cached (leading full blocks); then cache all of its full blocks."""
        hashes, prev = [], 0
        for i in range(len(ids) // self.block):
            prev = hash((prev, tuple(ids[i * self.block:(i + 1) * self.block])))
            hashes.append(prev)
        hit = 0
        for h in hashes:
            if h not in self.blocks:
                break
            hit += 1
        for h in reversed(hashes):               # deepest first, so prefixes outlive their extensions
            self.blocks[h] = None
            self.blocks.move_to_end(h)
        while len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)
        return hit * self.block


def prompt_ids(body: dict) -> list:
    p = body.get("prompt")
    if p is None:
        p = " ".join(str(m.get("content")) for m in body.get("messages") or [] if isinstance(m, dict))
    if isinstance(p, list) and p and isinstance(p[0], list):
        p = p[0]
    return p if isinstance(p, list) else str(p).split()


def build(ttft: float, itl: float, tokens: int, serial: bool, prefill_per_token: float = 0.0,
          cache_tokens: int = 0, block_tokens: int = 16) -> FastAPI:
    app = FastAPI()
    lock = asyncio.Lock()
    state = {"running": 0, "waiting": 0, "served": 0, "prompt_tokens": 0, "hit_tokens": 0}
    cache = PrefixCache(cache_tokens, block_tokens)

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/_stats")
    async def stats():
        return state

    @app.get("/metrics")
    async def metrics():
        text = (f"vllm:num_requests_running {state['running']}\nvllm:num_requests_waiting {state['waiting']}\n"
                "vllm:kv_cache_usage_perc 0.1\n")
        if prefill_per_token:
            text += (f"vllm:prefix_cache_queries_total {state['prompt_tokens']}\n"
                     f"vllm:prefix_cache_hits_total {state['hit_tokens']}\n"
                     f'vllm:cache_config_info{{block_size="{block_tokens}",num_gpu_blocks="{cache.capacity}"}} 1\n')
        return PlainTextResponse(text)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "stub", "object": "model"}]}

    async def produce(n: int):
        if ttft:
            await asyncio.sleep(ttft)
        for i in range(n):
            if i and itl:
                await asyncio.sleep(itl)
            yield "data: " + json.dumps({"choices": [{"index": 0, "text": " x"}]}) + "\n\n"
        yield "data: " + json.dumps({"choices": [{"index": 0, "text": "", "finish_reason": "length"}],
                                     "usage": {"prompt_tokens": 1, "completion_tokens": n}}) + "\n\n"
        yield "data: [DONE]\n\n"

    async def prefill(ids: list) -> None:
        async with lock:                          # one prefill at a time: the engine is compute-bound
            state["waiting"] -= 1
            state["running"] += 1
            hit = cache.lookup_and_fill(ids) if cache.capacity else 0
            state["prompt_tokens"] += len(ids)
            state["hit_tokens"] += hit
            await asyncio.sleep(prefill_per_token * (len(ids) - hit))

    @app.post("/v1/completions")
    @app.post("/v1/chat/completions")
    async def completions(request: Request):
        body = await request.json()
        n = int(body.get("max_tokens") or tokens) if prefill_per_token else tokens
        ids = prompt_ids(body) if prefill_per_token else []
        state["served"] += 1

        async def gen():
            state["waiting"] += 1
            if prefill_per_token:
                await prefill(ids)
            else:
                if serial:
                    await lock.acquire()
                state["waiting"] -= 1
                state["running"] += 1
            try:
                async for c in produce(n):
                    yield c
            finally:
                state["running"] -= 1
                if serial and not prefill_per_token:
                    lock.release()

        if body.get("stream"):
            return StreamingResponse(gen(), media_type="text/event-stream")
        async for _ in gen():
            pass
        return JSONResponse({"choices": [{"index": 0, "text": " x" * n}],
                             "usage": {"prompt_tokens": 1, "completion_tokens": n}})

    return app


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--ttft", type=float, default=0.0)
    ap.add_argument("--itl", type=float, default=0.0)
    ap.add_argument("--tokens", type=int, default=5)
    ap.add_argument("--serial", action="store_true")
    ap.add_argument("--prefill-per-token", type=float, default=0.0, help="seconds per uncached prompt token")
    ap.add_argument("--cache-tokens", type=int, default=0, help="prefix cache size in tokens (0: no cache)")
    ap.add_argument("--block-tokens", type=int, default=16)
    a = ap.parse_args()
    uvicorn.run(build(a.ttft, a.itl, a.tokens, a.serial, a.prefill_per_token, a.cache_tokens, a.block_tokens),
                host="127.0.0.1", port=a.port, log_level="warning", access_log=False)
