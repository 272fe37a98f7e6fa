"""Optional API keys (bearer) and per-key request and token rate limits (token buckets).

Keys are never logged: ``key_id`` is a short hash prefix. Token limits charge an estimate
at admission (prompt characters / 4 + max_tokens) and correct it with the response's
``usage`` when known.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

from gateway.admission import Rejected


def key_id(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:8]


def load_keys(env_keys: list[str], path: str | None) -> list[str]:
    keys = list(env_keys)
    if path:
        for line in Path(path).read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                keys.append(line)
    return keys


class Bucket:
    def __init__(self, per_minute: float) -> None:
        self.rate = per_minute / 60.0
        self.capacity = per_minute
        self.level = per_minute
        self.t = time.monotonic()

    def _refill(self) -> None:
        now = time.monotonic()
        self.level = min(self.capacity, self.level + (now - self.t) * self.rate)
        self.t = now

    def take(self, n: float) -> float:
        """Take n; returns 0 on success or the seconds to wait until it would succeed."""
        self._refill()
        if self.level >= n or self.level >= self.capacity:   # a request larger than the bucket passes when full
            self.level -= n
            return 0.0
        return (n - self.level) / self.rate

    def give_back(self, n: float) -> None:
        self._refill()
        self.level = min(self.capacity, self.level + n)


class Auth:
    def __init__(self, keys: list[str], requests_per_minute: float = 0, tokens_per_minute: float = 0):
        self.keys = set(keys)
        self.rpm, self.tpm = requests_per_minute, tokens_per_minute
        self.req: dict[str, Bucket] = {}
        self.tok: dict[str, Bucket] = {}

    @property
    def enabled(self) -> bool:
        return bool(self.keys)

    def check(self, authorization: str | None) -> str:
        """The caller's identity (key id, or 'anonymous' without auth); 401 on a bad key."""
        if not self.keys:
            return "anonymous"
        token = (authorization or "").removeprefix("Bearer ").strip()
        if token not in self.keys:
            raise Rejected(401, "bad_key", "Invalid or missing API key (Authorization: Bearer <key>).")
        return key_id(token)

    def charge(self, who: str, est_tokens: float) -> None:
        if self.rpm:
            wait = self.req.setdefault(who, Bucket(self.rpm)).take(1)
            if wait:
                raise Rejected(429, "rate_limit_requests", "Request rate limit exceeded.", wait)
        if self.tpm:
            wait = self.tok.setdefault(who, Bucket(self.tpm)).take(est_tokens)
            if wait:
                if self.rpm:
                    self.req[who].give_back(1)
                raise Rejected(429, "rate_limit_tokens", "Token rate limit exceeded.", wait)

    def correct(self, who: str, est_tokens: float, actual_tokens: float) -> None:
        if self.tpm and who in self.tok:
            b = self.tok[who]
            if actual_tokens < est_tokens:
                b.give_back(est_tokens - actual_tokens)
            else:
                b.level -= actual_tokens - est_tokens


def estimate_tokens(body: dict) -> float:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        n = len(prompt)
    elif "messages" in body:
        n = sum(len(str(m.get("content", ""))) for m in body.get("messages") or [] if isinstance(m, dict)) / 4
    else:
        n = len(str(prompt or "")) / 4
    return n + float(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
