"""Prompt prefixes for routing: rendering, block-chained hashes, a per-worker record.

Contract:

* ``render_prompt(path, body) -> str``: the text a worker will prefill, rendered the
  same way for every request (chat: tools, then each message as ``<role>content``,
  content parts joined; completions: the prompt string, or the first prompt of a
  batch, token ids as decimal text). It only has to be *consistent*, not identical to
  the worker's chat template: equal prefixes render to equal prefixes.
* ``block_hashes(text, block_bytes, max_blocks) -> list[int]``: the UTF-8 bytes cut
  into full blocks (the partial tail is not hashed, as an engine caches full blocks
  only); hash ``i`` covers blocks ``0..i`` (chained), so two prompts share hash ``i``
  exactly when they share their first ``i+1`` blocks. Stable across processes
  (BLAKE2b, not Python's salted ``hash``), so gateway replicas agree.
* ``PrefixIndex``: which block hashes each worker has been sent, approximately.
  Bounded (``max_blocks`` per worker, oldest dropped first), aged (an entry older
  than ``ttl`` seconds does not count), and prefix-closed: blocks of a request are
  touched deepest first, so a prefix is always at least as recent as its extensions
  and eviction or ageing removes extensions first; ``match`` can then binary-search.
  Pure data structure: the caller passes ``now``.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from hashlib import blake2b


def _content_text(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                out.append(part["text"])
            else:
                out.append(json.dumps(part, sort_keys=True, default=str))
        return "".join(out)
    return json.dumps(content, sort_keys=True, default=str)


def render_prompt(path: str, body: dict) -> str:
    if path.endswith("/chat/completions"):
        parts = []
        if body.get("tools"):
            parts.append("<tools>" + json.dumps(body["tools"], sort_keys=True, default=str) + "\n")
        for m in body.get("messages") or ():
            if not isinstance(m, dict):
                continue
            parts.append(f"<{m.get('role', '')}>{_content_text(m.get('content'))}")
            if m.get("tool_calls"):
                parts.append(json.dumps(m["tool_calls"], sort_keys=True, default=str))
            parts.append("\n")
        return "".join(parts)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        prompt = prompt[0]                          # a batch: route by its first prompt
    if isinstance(prompt, list):
        return " ".join(str(t) for t in prompt)     # token ids
    return prompt if isinstance(prompt, str) else ""


def block_hashes(text: str, block_bytes: int = 64, max_blocks: int = 256) -> list[int]:
    data = text.encode("utf-8", "surrogatepass")
    n = min(len(data) // block_bytes, max_blocks)
    out, prev = [], b""
    for i in range(n):
        prev = blake2b(prev + data[i * block_bytes:(i + 1) * block_bytes], digest_size=8).digest()
        out.append(int.from_bytes(prev, "little"))
    return out


class PrefixIndex:
    def __init__(self, max_blocks: int = 65536, ttl: float = 600.0) -> None:
        self.max_blocks, self.ttl = max_blocks, ttl
        self._rec: dict[str, OrderedDict[int, float]] = {}
        self._cap: dict[str, int] = {}              # per-worker bound learned from the worker's cache size

    def capacity(self, url: str) -> int:
        return min(self.max_blocks, self._cap.get(url, self.max_blocks))

    def set_capacity(self, url: str, blocks: int) -> None:
        self._cap[url] = max(1, int(blocks))

    def size(self, url: str) -> int:
        return len(self._rec.get(url, ()))

    def match(self, url: str, hashes: list[int], now: float) -> int:
        """Number of leading blocks of ``hashes`` this worker holds (fresh entries only)."""
        rec = self._rec.get(url)
        if not rec or not hashes:
            return 0
        horizon = now - self.ttl
        lo, hi = 0, len(hashes)                     # invariant: the first lo blocks are held
        while lo < hi:
            mid = (lo + hi + 1) // 2
            t = rec.get(hashes[mid - 1])
            if t is not None and t >= horizon:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def insert(self, url: str, hashes: list[int], now: float) -> None:
        rec = self._rec.setdefault(url, OrderedDict())
        for h in reversed(hashes):                  # deepest first: the root ends up most recent
            rec[h] = now
            rec.move_to_end(h)
        cap, horizon = self.capacity(url), now - self.ttl
        while rec:
            h, t = next(iter(rec.items()))
            if len(rec) <= cap and t >= horizon:
                break
            rec.popitem(last=False)

    def forget(self, url: str) -> None:
        self._rec.pop(url, None)
        self._cap.pop(url, None)
