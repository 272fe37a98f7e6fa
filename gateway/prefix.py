"""Prompt prefixes for routing: rendering, block-chained hashes, a per-worker record.

Contract:

* ``prompt_bytes(path, body) -> bytes``: what a worker will prefill, rendered the same
  way for every request (chat: tools, then each message as ``<role>content``, content
  parts joined, UTF-8; /v1/responses: ``instructions`` as a system message, then ``input``
  as one user message or as its message items; completions and /tokenize: the prompt
  string, or the first prompt of a batch;
  token ids as 4 bytes each, so a 128-byte block is 32 tokens). It only has to be
  *consistent*, not identical to the worker's chat template: equal prefixes render to
  equal prefixes.
* ``block_hashes(data, block_bytes, max_blocks) -> list[int]``: ``data`` cut into full
  blocks (the partial tail is not hashed, as an engine caches full blocks only); hash
  ``i`` identifies blocks ``0..i`` (a running CRC-32 and Adler-32 of the prefix, 64 bits,
  computed in C), so two prompts share hash ``i`` exactly when they share their first
  ``i+1`` blocks, up to a rare collision that only misjudges one cache hit. Stable across
  processes (not Python's salted ``hash``), so gateway replicas agree.
* ``PrefixIndex``: which block hashes each worker has been sent, approximately.
  Bounded (``max_blocks`` per worker, oldest dropped first), aged (an entry older
  than ``ttl`` seconds does not count), and prefix-closed: blocks of a request are
  touched deepest first, so a prefix is always at least as recent as its extensions
  and eviction or ageing removes extensions first; ``match`` can then binary-search.
  Pure data structure: the caller passes ``now``.
"""

from __future__ import annotations

import zlib
from array import array
from collections import OrderedDict

from swiftcommon.json_body import json_text


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
                out.append(json_text(part, sort_keys=True))
        return "".join(out)
    return json_text(content, sort_keys=True)


def _response_item(item):
    """A /v1/responses input item as the chat message the worker renders it as."""
    if not isinstance(item, dict) or item.get("type") not in ("function_call", "function_call_output"):
        return item
    if item["type"] == "function_call":
        return {"role": "assistant", "tool_calls": [item]}
    return {"role": "tool", "content": item.get("output")}


def render_prompt(path: str, body: dict) -> str:
    if path == "/v1/responses":
        inp = body.get("input")
        msgs = [{"role": "user", "content": inp}] if isinstance(inp, str) else inp if isinstance(inp, list) else []
        if isinstance(body.get("instructions"), str):
            msgs = [{"role": "system", "content": body["instructions"]}, *msgs]
        return render_prompt("/v1/chat/completions", {"messages": [_response_item(m) for m in msgs],
                                                      "tools": body.get("tools")})
    if path.endswith("/chat/completions") or (path == "/tokenize" and "messages" in body):
        parts = []
        if body.get("tools"):
            parts.append("<tools>" + json_text(body["tools"], sort_keys=True) + "\n")
        for m in body.get("messages") or ():
            if not isinstance(m, dict):
                continue
            parts.append(f"<{m.get('role', '')}>{_content_text(m.get('content'))}")
            if m.get("tool_calls"):
                parts.append(json_text(m["tool_calls"], sort_keys=True))
            parts.append("\n")
        return "".join(parts)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        prompt = prompt[0]                          # a batch: route by its first prompt
    if isinstance(prompt, list):
        return " ".join(map(str, prompt))           # token ids
    return prompt if isinstance(prompt, str) else ""


def prompt_bytes(path: str, body: dict) -> bytes:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
        prompt = prompt[0]
    if not path.endswith("/chat/completions") and isinstance(prompt, list) and prompt:
        try:
            return array("I", prompt).tobytes()     # token ids: 4 bytes each, no text rendering
        except (OverflowError, TypeError):
            pass                                    # not all valid ids (the worker will say so): as text
    return render_prompt(path, body).encode("utf-8", "surrogatepass")


def block_hashes(data: bytes, block_bytes: int = 128, max_blocks: int = 256) -> list[int]:
    view = memoryview(data)
    out, crc, adler = [], 0, 1
    for i in range(min(len(data) // block_bytes, max_blocks)):
        block = view[i * block_bytes:(i + 1) * block_bytes]
        crc, adler = zlib.crc32(block, crc), zlib.adler32(block, adler)
        out.append(crc << 32 | adler)
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
