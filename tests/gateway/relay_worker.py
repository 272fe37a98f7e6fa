"""A worker process that relays to a real worker and fails mid-stream on cue (no model of its own).

    python tests/gateway/relay_worker.py --port 9001 --upstream http://127.0.0.1:9000 --fail cut --after 8

Generation requests are relayed to ``--upstream`` with its status and headers (including
``x-swiftserve-continuation``), streams event by event with ``--delay`` seconds between
events. A stream fails once ``--after`` tokens of the whole generation have been sent
(counted from the events' ``token_ids``, a continuation's included: a continuation that
starts at or past that point is relayed whole), as set by ``--fail``: ``cut`` (the connection closes without ``[DONE]``: a dead
worker), ``exit`` (the process dies at once: connection reset), ``stall`` (nothing more is
sent: a hung worker), ``error`` (an in-band ``engine_error`` event and ``[DONE]``), ``drain``
(the next chunk ends with ``finish_reason "abort"`` / ``stop_reason "worker_shutdown"``, as a
worker whose drain time ran out), ``none`` (never), ``refuse`` (never, but a continuation is
answered with a 400, as a vLLM worker answers a constrained one). So a stream that migrates to another
relay completes there with the real worker's tokens, or fails again further on.
``/health``, ``/metrics`` and ``/load`` are relayed (``--queue``: ``/metrics`` reports that
fixed queue instead, so that a test can order relays for the gateway's ``jsq`` policy).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

PASS_HEADERS = ("content-type", "x-swiftserve-continuation")


def count_ids(event: str) -> int:
    """Generated tokens in one event (the gateway asks for token_ids; a Responses event has them at its
    top level), 0 for anything else."""
    data = [ln[6:] for ln in event.split("\n") if ln.startswith("data: {")]
    if not data:
        return 0
    obj = json.loads(data[0])
    return len(obj.get("token_ids") or ()) + sum(len(c.get("token_ids") or ()) for c in obj.get("choices") or ())


def build(upstream: str, fail: str, after: int, delay: float, queue: int | None = None) -> FastAPI:
    app = FastAPI()
    client = httpx.AsyncClient(base_url=upstream, timeout=600)

    @app.get("/{path:path}")
    async def relay_get(path: str):
        if path == "metrics" and queue is not None:      # a fixed queue: the gateway's jsq orders relays by it
            return Response(f"vllm:num_requests_running 0\nvllm:num_requests_waiting {queue}\n",
                            media_type="text/plain")
        r = await client.get("/" + path)
        return Response(r.content, status_code=r.status_code, media_type=r.headers.get("content-type"))

    async def generate(request: Request):
        raw = await request.body()
        body = json.loads(raw)
        done = len(body.get("continuation_token_ids") or ())
        if fail == "refuse" and done:
            return Response(json.dumps({"error": {"message": "continuation_token_ids cannot be combined with "
                                                  "structured outputs on this worker", "type": "invalid_request_error",
                                                  "param": "continuation_token_ids", "code": None}}),
                            status_code=400, media_type="application/json")
        req = client.build_request("POST", request.url.path, content=raw, headers={"content-type": "application/json"})
        r = await client.send(req, stream=True)
        headers = {k: v for k, v in r.headers.items() if k in PASS_HEADERS}
        if not body.get("stream") or r.status_code != 200:
            data = await r.aread()
            await r.aclose()
            return Response(data, status_code=r.status_code, headers=headers)

        async def events():
            n, buf = 0, ""
            try:
                async for text in r.aiter_text():
                    buf += text
                    while "\n\n" in buf:
                        event, buf = buf.split("\n\n", 1)
                        if n and delay:
                            await asyncio.sleep(delay)
                        if fail != "none" and done < after <= done + n:
                            if fail == "exit":
                                os._exit(1)
                            if fail == "stall":
                                await asyncio.sleep(3600)
                            if fail == "error":
                                yield 'data: {"error": {"message": "engine died", "type": "service_unavailable", ' \
                                      '"param": null, "code": "engine_error"}}\n\ndata: [DONE]\n\n'
                            if fail == "drain" and event.startswith("data: {"):
                                obj = json.loads(event[6:])
                                for c in obj.get("choices", []):
                                    c["finish_reason"], c["stop_reason"] = "abort", "worker_shutdown"
                                yield "data: " + json.dumps(obj) + "\n\ndata: [DONE]\n\n"
                            return          # "cut": the body ends without [DONE]
                        n += count_ids(event)
                        yield event + "\n\n"
            finally:
                await r.aclose()

        return StreamingResponse(events(), headers=headers)

    app.post("/v1/completions")(generate)
    app.post("/v1/chat/completions")(generate)
    app.post("/v1/responses")(generate)
    return app


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--fail", choices=("cut", "exit", "stall", "error", "drain", "none", "refuse"), default="none")
    ap.add_argument("--after", type=int, default=8)
    ap.add_argument("--delay", type=float, default=0.0)
    ap.add_argument("--queue", type=int, default=None, help="report this vllm:num_requests_waiting on /metrics")
    a = ap.parse_args()
    uvicorn.run(build(a.upstream, a.fail, a.after, a.delay, a.queue), host="127.0.0.1", port=a.port, log_level="warning",
                access_log=False)
