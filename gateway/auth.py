"""Optional API keys (bearer) and per-key request and token rate limits (token buckets).

Keys are never logged: ``key_id`` is a short hash prefix. The scheme is case-insensitive
(``Bearer``, ``bearer``; RFC 9110), and a 401 names it in ``WWW-Authenticate``
(``CHALLENGE``). A presented key is compared
with every configured key in constant time (``hmac.compare_digest`` of SHA-256
digests, so neither the position of the first differing byte nor the key's length
shows in the timing). Token limits charge an estimate
at admission (prompt characters / 4 + the output limit the worker will apply, by the one
rule in ``swiftcommon.token_limits``) and correct it with the response's ``usage`` when known.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import time
from pathlib import Path

from gateway.admission import Rejected
from swiftcommon.json_body import json_text
from swiftcommon.token_limits import DEFAULT_COMPLETION_TOKENS, endpoint_of, requested_limit


CHALLENGE = {"WWW-Authenticate": 'Bearer realm="swiftserve"'}


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
        self._digests = [hashlib.sha256(k.encode()).digest() for k in sorted(self.keys)]
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
        scheme, _, rest = (authorization or "").strip().partition(" ")
        token = rest.strip() if scheme.lower() == "bearer" else (authorization or "").strip()
        digest = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
        match = False
        for d in self._digests:                 # every key is compared: no early exit
            match |= hmac.compare_digest(digest, d)
        if not match:
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


def _count(value, default: float) -> float:
    """A JSON number usable as a token count, else ``default`` (the worker rejects bad values)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return default
    try:
        value = float(value)
    except OverflowError:           # an integer beyond float range
        return default
    return value if math.isfinite(value) and value >= 0 else default


def requested_tokens(body: dict) -> float:
    """The output limit the worker will apply (``swiftcommon.token_limits``); unset, zero or
    unusable: the completions default, as an estimate (the response's usage corrects it)."""
    return _count(requested_limit(endpoint_of(body), body), 0) or float(DEFAULT_COMPLETION_TOKENS)


def estimate_tokens(body: dict) -> float:
    """Prompt characters / 4 (or token ids) + max_tokens; any JSON body gives a number. Tools and
    assistant ``tool_calls`` count as their JSON text: the chat template renders them into the prompt."""
    prompt, msgs = body.get("prompt"), body.get("messages")
    if "input" in body:                                      # /v1/responses: text or message items
        inp = body["input"]
        prompt, msgs = (inp, None) if isinstance(inp, str) else (prompt, inp)
    if isinstance(msgs, list):
        n = sum(_chars(m.get("content")) + _json_chars(m.get("tool_calls")) + _chars(m.get("output"))
                + _chars(m.get("arguments")) for m in msgs if isinstance(m, dict)) / 4   # + responses' call items
    elif isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        n = len(prompt)
    else:
        n = _chars(prompt) / 4
    return n + _json_chars(body.get("tools")) / 4 + requested_tokens(body)


def _json_chars(value) -> int:
    if not value:
        return 0
    try:
        return len(json_text(value))
    except (TypeError, ValueError, RecursionError):
        return 0


def _chars(value) -> int:
    """Characters of a string, or of the strings (and text parts) in a list."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(len(v) if isinstance(v, str) else len(v.get("text", "")) if isinstance(v, dict)
                   and isinstance(v.get("text"), str) else 0 for v in value)
    return 0
