"""One open-loop run at one arrival rate.

The schedule is computed before the first request. Each request is launched at its
scheduled offset whatever the state of earlier ones (open loop); ``max_concurrency``
optionally caps requests in flight (then sends may lag, which ``send_lag`` shows). A
few warm-up requests run first, sequentially, and are not measured.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import asdict, dataclass, field

import httpx
import numpy as np

from loadtest.client import RequestRecord, build_body, send
from loadtest.datasets import RequestSpec
from loadtest.metrics import summarize
from loadtest.schedule import arrival_times


@dataclass
class RunConfig:
    base_url: str
    model: str | None = None
    endpoint: str = "completions"         # completions | chat
    rate: float = 1.0                     # requests/s; inf = all at once
    arrival: str = "poisson"
    burstiness: float = 1.0
    num_requests: int = 100
    max_concurrency: int | None = None
    warmup: int = 2
    ignore_eos: bool = True
    seed: int = 0
    timeout: float = 600.0
    label: str = "run"
    slos_ms: dict[str, float] = field(default_factory=dict)
    api_key: str | None = None
    extra_body: dict = field(default_factory=dict)


async def detect_model(client: httpx.AsyncClient, base_url: str) -> str:
    r = await client.get(base_url.rstrip("/") + "/v1/models")
    r.raise_for_status()
    data = r.json().get("data") or []
    if not data:
        raise RuntimeError(f"{base_url}/v1/models lists no model; pass --model")
    return data[0]["id"]


async def run(cfg: RunConfig, requests: list[RequestSpec], progress: bool = True) -> dict:
    from tqdm import tqdm

    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else None
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(cfg.timeout, connect=10), limits=limits,
                                 headers=headers) as client:
        model = cfg.model or await detect_model(client, cfg.base_url)
        chat = cfg.endpoint == "chat"
        url = cfg.base_url.rstrip("/") + ("/v1/chat/completions" if chat else "/v1/completions")
        bodies = [build_body(r, model, cfg.ignore_eos, chat, cfg.extra_body) for r in requests]
        for body in bodies[:cfg.warmup]:
            rec = await send(client, url, dict(body, max_tokens=min(4, body["max_tokens"]),
                                               min_tokens=min(4, body.get("min_tokens", 0))), RequestRecord(0.0), chat)
            if not rec.success:
                raise RuntimeError(f"warm-up request failed: {rec.error}")
        offsets = arrival_times(len(bodies), cfg.rate, cfg.arrival, cfg.burstiness, cfg.seed)
        sem = asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency else None
        bar = tqdm(total=len(bodies), desc=f"{cfg.label} @ {cfg.rate} req/s", unit="req", disable=not progress)
        records = [RequestRecord(o) for o in offsets]
        start = time.perf_counter()

        async def one(i: int) -> None:
            delay = start + offsets[i] - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if sem:
                async with sem:
                    await send(client, url, bodies[i], records[i], chat)
            else:
                await send(client, url, bodies[i], records[i], chat)
            bar.update(1)

        await asyncio.gather(*(one(i) for i in range(len(bodies))))
        end = max([r.chunk_times[-1] for r in records if r.chunk_times] + [time.perf_counter()])
        bar.close()
    duration = end - start
    summary, warnings = summarize(records, duration, [r.input_len for r in requests], cfg.slos_ms or None)
    lags = np.asarray([r.sent - start - r.scheduled for r in records])
    sends = sorted(r.sent for r in records)
    span = sends[-1] - sends[0] if len(sends) > 1 else 0.0
    summary.update({
        "label": cfg.label, "model_id": model, "endpoint": cfg.endpoint,
        "request_rate": cfg.rate if math.isfinite(cfg.rate) else "inf", "burstiness": cfg.burstiness,
        "arrival": cfg.arrival, "max_concurrency": cfg.max_concurrency, "num_prompts": len(requests),
        "achieved_request_rate": (len(sends) - 1) / span if span > 0 else None,
        "mean_send_lag_ms": float(lags.mean() * 1000), "p99_send_lag_ms": float(np.percentile(lags, 99) * 1000),
        "max_send_lag_ms": float(lags.max() * 1000), "warnings": warnings,
        "config": {k: v for k, v in asdict(cfg).items() if k not in ("api_key",)},
        "requests": [{"scheduled_s": r.scheduled, "send_lag_s": r.sent - start - r.scheduled,
                      "ttft_s": r.ttft, "e2el_s": r.e2el, "output_tokens": r.output_tokens,
                      "prompt_tokens": r.prompt_tokens, "chunks": len(r.chunk_times), "success": r.success,
                      "error": r.error or None} for r in records],
    })
    if summary["config"]["rate"] == float("inf"):
        summary["config"]["rate"] = "inf"
    return summary
