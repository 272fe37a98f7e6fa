"""Event-loop time of issue 47's large hostile bodies, in process (no model, no sockets).

    PYTHONPATH=$PWD python -m studies.hostile_body_cost [--repeats 7] [--out FILE]

For each regression of ``benchmarks.lib.fuzz.regressions`` whose body is over 64 KB (100,000
choices, 500,000 stop strings with n = 2, 40,000 tools, a 7 MB prompt), the median time of:

- **gateway**: what the gateway's event loop does with the body before forwarding it:
  ``gateway.edge.parse_body``, the token estimate (``gateway.auth.estimate_tokens``) and the
  prefix policy's block hashes (``gateway.prefix``);
- **worker**: the worker's app answering the body (``worker.app.build_app`` on the fake engine
  and tiny tokenizer of ``tests/worker/fakes.py``, called through ASGI in this process):
  FastAPI's body parsing and validation, the handler, the 400.

Everything runs on one thread, so each figure is time the event loop could not serve anything
else. Run it against another tree's code (``PYTHONPATH=/other/tree``) to compare versions.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

from benchmarks.lib.records import command_line, write_json

ROOT = Path(__file__).resolve().parent.parent

MODEL = "fake-model"


def _fakes():
    spec = importlib.util.spec_from_file_location("worker_test_fakes", ROOT / "tests" / "worker" / "fakes.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["worker_test_fakes"] = mod
    spec.loader.exec_module(mod)
    return mod


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - t))
    return round(statistics.median(times), 1)


def gateway_ms(path: str, raw: bytes, repeats: int) -> float:
    from gateway.auth import estimate_tokens
    from gateway.edge import parse_body
    from gateway.prefix import block_hashes, prompt_bytes

    def once():
        body = parse_body(path, raw)
        estimate_tokens(body)
        block_hashes(prompt_bytes(path, body))

    return _median_ms(once, repeats)


async def worker_ms(cases: list[tuple[str, bytes]], repeats: int) -> list[tuple[float, int]]:
    import httpx
    from refengine.config import EngineConfig
    from worker.app import build_app
    from worker.config import WorkerConfig

    fakes = _fakes()
    app = build_app(WorkerConfig(engine_config=EngineConfig(model="/models/fake-model"), served_model_name=(MODEL,)),
                    fakes.FakeEngineClient(), fakes.make_tokenizer())
    out = []
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                                                   base_url="http://worker") as client:
        for path, raw in cases:
            times, status = [], None
            for _ in range(repeats):
                t = time.perf_counter()
                r = await client.post(path, content=raw, headers={"content-type": "application/json"})
                times.append(1e3 * (time.perf_counter() - t))
                status = r.status_code
            out.append((round(statistics.median(times), 1), status))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=7, help="timings per body (the median is reported)")
    ap.add_argument("--out", default=None, help="also write the figures to this JSON file")
    args = ap.parse_args(argv)
    from benchmarks.lib.fuzz import regressions

    cases = []
    for path, case in regressions():
        raw = json.dumps({**case, "model": MODEL}).encode()
        if len(raw) > 64 * 1024:
            cases.append((" ".join(k for k in case if k not in ("model", "messages")), path, raw))
    worker = asyncio.run(worker_ms([(p, raw) for _, p, raw in cases], args.repeats))
    rows = []
    print(f"{'body':32} {'MB':>5} {'gateway ms':>11} {'worker ms':>10} status")
    for (name, path, raw), (w, status) in zip(cases, worker):
        g = gateway_ms(path, raw, args.repeats)
        rows.append({"body": name, "path": path, "mb": round(len(raw) / 1e6, 2), "gateway_ms": g, "worker_ms": w,
                     "worker_status": status})
        print(f"{name:32} {len(raw) / 1e6:5.2f} {g:11.1f} {w:10.1f} {status}", flush=True)
    if args.out:
        write_json(args.out, {"command": command_line(argv), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
