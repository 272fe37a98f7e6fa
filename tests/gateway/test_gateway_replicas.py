"""Two gateway replicas in front of the same workers (real processes on loopback).

Replica A concentrates a hot prefix on one worker (its load bound is switched off with a
huge ``--balance-eps``/``--balance-floor`` and no load weight); replica B then receives as many requests
with unrelated prompts. B sees A's requests only through the worker's own metrics
(``vllm:num_requests_running``), adds its own in-flight counts, and must send all of
its requests to the other worker. A replica that counted only its own in-flight
requests would split them evenly and leave the workers at 9 and 3.
"""

import asyncio

import httpx
import pytest
from fault_support import fault_worker, gateway, request, set_fault, stats, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
N = 6


def test_two_gateways_keep_the_workers_balanced():
    workers = [fault_worker(name) for name in ("a", "b")]
    gws = []
    try:
        for w in workers:
            set_fault(w, tokens=80, token_delay=0.1)            # ~8 s streams
        gws = [gateway(workers, "--balance-eps", "1000", "--balance-floor", "1000", "--prefix-load-weight", "0"), gateway(workers)]
        hot = {"model": "m", "prompt": "Shared system prompt. " * 40, "max_tokens": 80, "stream": True}

        async def scenario(client):
            first = [asyncio.create_task(request(client, gws[0].url + "/v1/completions", hot)) for _ in range(N)]
            await asyncio.to_thread(wait_for, lambda: sum(stats(w)["active"] for w in workers) == N, 20,
                                    "replica A's requests to start")
            skew = sorted(stats(w)["active"] for w in workers)
            await asyncio.sleep(0.5)                            # B's next scrape sees them
            second = [asyncio.create_task(request(client, gws[1].url + "/v1/completions",
                                                  dict(hot, prompt=f"unrelated question {i}")))
                      for i in range(N)]
            await asyncio.to_thread(wait_for, lambda: sum(stats(w)["active"] for w in workers) == 2 * N, 20,
                                    "replica B's requests to start")
            both = sorted(stats(w)["active"] for w in workers)
            results = await asyncio.gather(*first, *second)
            return skew, both, results

        async def main():
            async with httpx.AsyncClient(timeout=60) as client:
                return await scenario(client)

        skew, both, results = asyncio.run(main())
        assert skew == [0, N]                                   # A piled its hot prefix onto one worker
        assert both == [N, N]                                   # B filled the other one
        assert [r[2] for r in results] == ["complete"] * (2 * N)
    finally:
        for p in gws + workers:
            p.kill()
