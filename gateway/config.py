"""GatewayConfig: the one configuration object of a gateway process (built by the CLI)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GatewayConfig:
    workers: list[str] = field(default_factory=list)   # base URLs, e.g. http://10.0.0.5:8000
    host: str = "127.0.0.1"
    port: int = 8000
    policy: str = "jsq"                    # jsq | round_robin
    scrape_interval: float = 0.1           # seconds between /metrics scrapes of each worker
    scrape_timeout: float = 0.5
    stale_after: float = 2.0               # scraped figures older than this count as unknown
    connect_timeout: float = 5.0
    first_byte_timeout: float = 600.0      # a worker that answers nothing for this long is abandoned
    max_attempts: int = 2                  # tries on different workers before the first byte
    max_body_bytes: int = 8 * 1024 * 1024
    log_level: str = "info"
