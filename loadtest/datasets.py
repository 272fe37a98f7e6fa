"""Request datasets: random token prompts, shared-prefix prompts, user JSONL.

Random prompts are token-id lists (the OpenAI completions API accepts ``prompt`` as a
list of ints; vLLM and our worker do), so their length is exact without a tokenizer.
Prompt-heavy default: 1000 input tokens : 100 output tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass
class RequestSpec:
    prompt: list[int] | str | None       # completions
    messages: list[dict] | None          # chat
    max_tokens: int
    input_len: int | None = None         # known for token prompts


def random_prompts(n: int, input_len: int, output_len: int, vocab: tuple[int, int] = (1000, 40000),
                   range_ratio: float = 0.0, seed: int = 0) -> list[RequestSpec]:
    """Uniform random token ids; lengths vary by +/- range_ratio around the targets."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        il = max(1, int(rng.integers(int(input_len * (1 - range_ratio)), int(input_len * (1 + range_ratio)) + 1)))
        ol = max(1, int(rng.integers(int(output_len * (1 - range_ratio)), int(output_len * (1 + range_ratio)) + 1)))
        out.append(RequestSpec(rng.integers(vocab[0], vocab[1], il).tolist(), None, ol, il))
    return out


def shared_prefix_prompts(n: int, prefix_len: int, suffix_len: int, output_len: int, num_prefixes: int = 4,
                          seed: int = 0) -> list[RequestSpec]:
    """RAG-like: a few long shared prefixes (documents) + a short unique suffix (question)."""
    rng = np.random.default_rng(seed)
    prefixes = [rng.integers(1000, 40000, prefix_len).tolist() for _ in range(num_prefixes)]
    out = []
    for i in range(n):
        p = prefixes[i % num_prefixes] + rng.integers(1000, 40000, suffix_len).tolist()
        out.append(RequestSpec(p, None, output_len, len(p)))
    return out


def jsonl_prompts(path: str | Path, n: int | None, default_output_len: int) -> list[RequestSpec]:
    """Lines with {"prompt": str|[int]} or {"messages": [...]}, optional "max_tokens"."""
    out = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            d = json.loads(line)
            if "prompt" not in d and "messages" not in d:
                raise ValueError(f"{path}:{lineno}: needs 'prompt' or 'messages'")
            p = d.get("prompt")
            out.append(RequestSpec(p, d.get("messages"), int(d.get("max_tokens", default_output_len)),
                                   len(p) if isinstance(p, list) else None))
            if n is not None and len(out) >= n:
                break
    if not out:
        raise ValueError(f"{path}: no requests")
    if n is not None and len(out) < n:
        out = [out[i % len(out)] for i in range(n)]
    return out
