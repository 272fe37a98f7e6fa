"""One streamed request and its timestamps (monotonic ``time.perf_counter``).

A *token chunk* is an SSE event that carries non-empty text. The number of output
tokens comes from ``usage.completion_tokens`` (``stream_options.include_usage``);
when it disagrees with the number of token chunks, the record says so.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import httpx

from loadtest.datasets import RequestSpec


@dataclass
class RequestRecord:
    scheduled: float                  # offset from the run start at which it should have been sent
    sent: float = 0.0                 # perf_counter at send
    chunk_times: list[float] = field(default_factory=list)
    text: str = ""
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    success: bool = False
    error: str = ""
    status: int | None = None
    done: bool = False                # the stream ended with data: [DONE]
    told: bool = False                # an explicit error reached the client (HTTP error status or error event)

    @property
    def outcome(self) -> str:
        """'complete' (tokens and [DONE]), 'error' (the client was told) or 'lost' (neither)."""
        if self.told:
            return "error"
        return "complete" if self.success and self.done else "lost"

    @property
    def ttft(self) -> float | None:
        return self.chunk_times[0] - self.sent if self.chunk_times else None

    @property
    def e2el(self) -> float | None:
        return self.chunk_times[-1] - self.sent if self.chunk_times else None


def build_body(spec: RequestSpec, model: str, ignore_eos: bool, chat: bool, extra: dict) -> dict:
    body = {"model": model, "max_tokens": spec.max_tokens, "stream": True, "stream_options": {"include_usage": True},
            "temperature": extra.get("temperature", 0.0)}
    if ignore_eos:
        body["ignore_eos"] = True      # vLLM extension: fixed output length for fair A/B runs
        body["min_tokens"] = spec.max_tokens
    if chat:
        body["messages"] = spec.messages or [{"role": "user", "content": spec.prompt if isinstance(spec.prompt, str)
                                              else " ".join(map(str, spec.prompt))}]
    else:
        body["prompt"] = spec.prompt if spec.prompt is not None else spec.messages[-1]["content"]
    body.update({k: v for k, v in extra.items() if k != "temperature"})
    return body


async def send(client: httpx.AsyncClient, url: str, body: dict, rec: RequestRecord, chat: bool,
               headers: dict | None = None) -> RequestRecord:
    rec.sent = time.perf_counter()
    try:
        async with client.stream("POST", url, json=body, headers=headers) as r:
            rec.status = r.status_code
            if r.status_code != 200:
                rec.error = f"HTTP {r.status_code}: {(await r.aread()).decode(errors='replace')[:300]}"
                rec.told = True
                return rec
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    rec.done = True
                    break
                obj = json.loads(data)
                if "error" in obj:
                    rec.error = json.dumps(obj["error"])[:300]
                    rec.told = True
                    return rec
                if obj.get("usage"):
                    rec.prompt_tokens = obj["usage"].get("prompt_tokens")
                    rec.output_tokens = obj["usage"].get("completion_tokens")
                for ch in obj.get("choices") or []:
                    piece = (ch.get("delta") or {}).get("content") if chat else ch.get("text")
                    if piece:
                        rec.chunk_times.append(time.perf_counter())
                        rec.text += piece
        rec.success = bool(rec.chunk_times)
        if not rec.success:
            rec.error = "no tokens received"
    except (httpx.HTTPError, OSError, ValueError) as exc:
        rec.error = f"{type(exc).__name__}: {exc}"[:300]
    return rec
