"""Logging helpers shared by the gateway and worker processes."""

from __future__ import annotations

import logging

PROBE_PATHS = ("/metrics", "/health", "/load")


class _DropProbes(logging.Filter):
    """Drop uvicorn access-log lines of scrapes and health probes (10 per second per worker)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not (len(args) >= 3 and isinstance(args[2], str) and args[2].split("?")[0] in PROBE_PATHS)


def quiet_probe_logs() -> None:
    logging.getLogger("uvicorn.access").addFilter(_DropProbes())
    logging.getLogger("httpx").setLevel(logging.WARNING)      # the gateway's scrape requests
