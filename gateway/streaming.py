"""Light inspection of a proxied response body for gateway metrics.

We do not parse the stream, only look for markers in the raw bytes as they pass:
the first SSE event carrying generated text (TTFT), the last one (for TPOT), and
``usage.completion_tokens``. Bytes go to the client unchanged.
"""

from __future__ import annotations

import re
import time

TEXT = re.compile(rb'"(?:text|content)"\s*:\s*"(?!")')
USAGE = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')


class StreamStats:
    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.completion_tokens: int | None = None
        self._tail = b""

    def feed(self, chunk: bytes) -> None:
        data = self._tail + chunk
        now = time.monotonic()
        if TEXT.search(data):
            self.first_token = self.first_token or now
            self.last_token = now
        for m in USAGE.finditer(data):
            self.completion_tokens = int(m.group(1))
        self._tail = data[-64:]          # a marker may straddle two chunks

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.t0

    @property
    def tpot(self) -> float | None:
        n = self.completion_tokens
        if self.first_token is None or not n or n < 2:
            return None
        return (self.last_token - self.first_token) / (n - 1)
