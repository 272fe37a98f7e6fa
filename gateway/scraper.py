"""Scrapes every worker's /metrics concurrently, every ``scrape_interval`` seconds.

Reads vLLM's names (so stock `vllm serve` workers work too): ``vllm:num_requests_waiting``,
``vllm:num_requests_running``, ``vllm:kv_cache_usage_perc`` (or the older
``vllm:gpu_cache_usage_perc``), summed over label sets; for the prefix policy also the
prefix-cache counters ``vllm:prefix_cache_queries_total`` / ``vllm:prefix_cache_hits_total``
and the cache size from ``vllm:cache_config_info{block_size, num_gpu_blocks}`` (the
labels of that info gauge). A failed scrape leaves the last
figures in place, where they go stale (see routing); health is decided by gateway.health.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time

import aiohttp

from gateway.routing.base import WorkerState

log = logging.getLogger(__name__)
NAMES = {"vllm:num_requests_waiting": "waiting", "vllm:num_requests_running": "running",
         "vllm:kv_cache_usage_perc": "kv_usage", "vllm:gpu_cache_usage_perc": "kv_usage",
         "vllm:prefix_cache_queries_total": "prefix_queries", "vllm:prefix_cache_hits_total": "prefix_hits",
         "vllm:cache_config_info": "cache_tokens"}
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def _cache_tokens(line: str) -> float | None:
    labels = dict(_LABEL.findall(line.split("}", 1)[0]))
    try:
        return float(int(labels["num_gpu_blocks"]) * int(labels["block_size"]))
    except (KeyError, ValueError):
        return None


def parse_metrics(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        key = NAMES.get(name)
        if key is None:
            continue
        if key == "cache_tokens":
            tokens = _cache_tokens(line)
            if tokens:
                out[key] = tokens
            continue
        try:
            value = float(line.rsplit(" ", 1)[1])
        except (IndexError, ValueError):
            continue
        if key == "kv_usage" and key in out and name == "vllm:gpu_cache_usage_perc":
            continue  # both names present: prefer the current one
        out[key] = out.get(key, 0.0) + value if key != "kv_usage" else value
    if "cache_tokens" in out:
        out["cache_tokens"] = int(out["cache_tokens"])
    return out


class Scraper:
    def __init__(self, workers: list[WorkerState], client: aiohttp.ClientSession, interval: float, timeout: float):
        self.workers, self.client, self.interval, self.timeout = workers, client, interval, timeout

    async def scrape_one(self, w: WorkerState) -> None:
        in_flight = w.in_flight
        try:
            async with self.client.get(w.url + "/metrics", timeout=aiohttp.ClientTimeout(total=self.timeout)) as r:
                r.raise_for_status()
                m = parse_metrics((await r.read()).decode("utf-8", "replace"))
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
            return
        w.waiting, w.running, w.kv_usage = m.get("waiting"), m.get("running"), m.get("kv_usage")
        w.prefix_queries, w.prefix_hits, w.cache_tokens = m.get("prefix_queries"), m.get("prefix_hits"), \
            m.get("cache_tokens")
        w.scraped_at, w.in_flight_at_scrape = time.monotonic(), in_flight

    async def run(self) -> None:
        while True:
            await asyncio.gather(*(self.scrape_one(w) for w in list(self.workers)))
            await asyncio.sleep(self.interval)
