"""Engine logprobs (token ids) -> OpenAI's two logprob formats.

Completions: ``{tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}``
where each ``top_logprobs`` dict holds the k best alternatives plus the sampled
token (OpenAI: "up to logprobs+1 elements"). Chat: ``content: [{token, logprob,
bytes, top_logprobs: [{token, logprob, bytes}] * k}]``.

A token's string is ``decode([id])`` with special tokens kept. A byte-level BPE
token that is only part of a UTF-8 character decodes to U+FFFD; its ``bytes`` are
then recovered from the byte-level alphabet, so clients can reassemble text.
JSON has no -inf: logprobs are clamped to -9999.0 (as vLLM does).
"""

from __future__ import annotations

import math
from functools import lru_cache

from refengine.outputs import TokenLogprob
from worker.protocol import ChatLogprobToken, CompletionLogprobs, TopLogprob

MIN_LOGPROB = -9999.0


def clamp(lp: float) -> float:
    if math.isnan(lp):
        return MIN_LOGPROB
    return max(float(lp), MIN_LOGPROB)


def _byte_level_decoder() -> dict[str, int]:
    """Inverse of the GPT-2 byte -> printable character table used by byte-level BPE."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars = list(keep)
    n = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(keep, chars, strict=True)}


_BYTE_DECODER = _byte_level_decoder()


class TokenTexts:
    """Cached id -> (string, bytes) for one tokenizer."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.lookup = lru_cache(maxsize=1 << 16)(self._compute)

    def _compute(self, token_id: int) -> tuple[str, tuple[int, ...]]:
        text = self.tokenizer.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        raw = text.encode("utf-8")
        if "\ufffd" in text:
            piece = self.tokenizer.convert_ids_to_tokens(token_id)
            if isinstance(piece, str) and piece and all(c in _BYTE_DECODER for c in piece):
                raw = bytes(_BYTE_DECODER[c] for c in piece)
        return text, tuple(raw)

    def text(self, token_id: int) -> str:
        return self.lookup(token_id)[0]

    def bytes(self, token_id: int) -> list[int]:
        return list(self.lookup(token_id)[1])


def completion_logprobs(texts: TokenTexts, lps: list[TokenLogprob], k: int,
                        offset: int) -> tuple[CompletionLogprobs, int]:
    """Format a run of tokens; ``offset`` is where the first token starts in the choice's text.
    Returns the block and the offset after the last token."""
    out = CompletionLogprobs()
    for lp in lps:
        tok = texts.text(lp.token_id)
        out.tokens.append(tok)
        out.token_logprobs.append(clamp(lp.logprob))
        top: dict[str, float] = {}
        for tid, v in lp.top[:k]:
            top.setdefault(texts.text(tid), clamp(v))
        top.setdefault(tok, clamp(lp.logprob))
        out.top_logprobs.append(top)
        out.text_offset.append(offset)
        offset += len(tok)
    return out, offset


def chat_logprobs(texts: TokenTexts, lps: list[TokenLogprob], k: int) -> list[ChatLogprobToken]:
    entries = []
    for lp in lps:
        tops = [TopLogprob(token=texts.text(tid), logprob=clamp(v), bytes=texts.bytes(tid)) for tid, v in lp.top[:k]]
        entries.append(ChatLogprobToken(token=texts.text(lp.token_id), logprob=clamp(lp.logprob),
                                        bytes=texts.bytes(lp.token_id), top_logprobs=tops))
    return entries
