"""``swiftserve-gateway`` / ``python -m gateway``: start the gateway."""

from __future__ import annotations

import argparse
import logging

from gateway.config import GatewayConfig
from swiftserve import envs


def parse_args(argv=None) -> GatewayConfig:
    d = GatewayConfig()
    p = argparse.ArgumentParser(prog="swiftserve-gateway",
                                description="OpenAI-compatible gateway routing to the worker with the shortest queue.")
    p.add_argument("--workers", default=",".join(envs.worker_urls()),
                   help="comma-separated worker base URLs (default: $SWIFTSERVE_WORKERS)")
    p.add_argument("--host", default=d.host)
    p.add_argument("--port", type=int, default=d.port)
    p.add_argument("--policy", choices=["jsq", "round_robin"], default=d.policy,
                   help="routing policy (default: %(default)s)")
    p.add_argument("--scrape-interval", type=float, default=d.scrape_interval)
    p.add_argument("--stale-after", type=float, default=d.stale_after)
    p.add_argument("--first-byte-timeout", type=float, default=d.first_byte_timeout)
    p.add_argument("--max-attempts", type=int, default=d.max_attempts)
    p.add_argument("--log-level", default=envs.log_level())
    a = p.parse_args(argv)
    workers = [u.strip().rstrip("/") for u in a.workers.split(",") if u.strip()]
    if not workers:
        p.error("no workers: pass --workers URL[,URL...] or set SWIFTSERVE_WORKERS")
    return GatewayConfig(workers=workers, host=a.host, port=a.port, policy=a.policy, scrape_interval=a.scrape_interval,
                         stale_after=a.stale_after, first_byte_timeout=a.first_byte_timeout,
                         max_attempts=a.max_attempts, log_level=a.log_level)


def main(argv=None) -> int:
    import uvicorn

    from gateway.app import build_app

    cfg = parse_args(argv)
    logging.basicConfig(level=cfg.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from swiftserve.logs import quiet_probe_logs

    quiet_probe_logs()
    uvicorn.run(build_app(cfg), host=cfg.host, port=cfg.port, log_level=cfg.log_level)
    return 0
