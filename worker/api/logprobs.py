"""Engine logprobs (token ids) -> OpenAI's two logprob formats.

Completions: ``{tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}``
where each ``top_logprobs`` dict holds the k best alternatives plus the sampled
token (OpenAI: "up to logprobs+1 elements"); with ``echo`` the prompt's tokens come
first, the first one with ``null`` logprob and top (nothing predicts it), as OpenAI.
Chat: ``content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}] * k}]``.
vLLM's ``prompt_logprobs``: per prompt token ``null`` (the first) or ``{token_id:
{logprob, rank, decoded_token}}`` holding the token itself and the k best.

A token's string and its ``bytes`` come from ``worker.token_texts.TokenTexts``.
JSON has no -inf: logprobs are clamped to -9999.0 (as vLLM does).
"""

from __future__ import annotations

import math

from refengine.outputs import TokenLogprob
from worker.api.choice_models import ChatLogprobToken, CompletionLogprobs, PromptLogprob, PromptLogprobs, TopLogprob
from worker.token_texts import TokenTexts

MIN_LOGPROB = -9999.0


def clamp(lp: float) -> float:
    if math.isnan(lp):
        return MIN_LOGPROB
    return max(float(lp), MIN_LOGPROB)


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


def echo_logprobs(texts: TokenTexts, prompt_ids: list[int], plps: list[TokenLogprob | None],
                  k: int) -> tuple[CompletionLogprobs, int]:
    """The prompt's part of an echoed completion's logprobs; returns it and the offset after it."""
    first = texts.text(prompt_ids[0])
    out, offset = completion_logprobs(texts, plps[1:], k, len(first))
    out.tokens.insert(0, first)
    out.token_logprobs.insert(0, None)
    out.top_logprobs.insert(0, None)
    out.text_offset.insert(0, 0)
    return out, offset


def extend_logprobs(into: CompletionLogprobs, block: CompletionLogprobs) -> None:
    for name in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        getattr(into, name).extend(getattr(block, name))


def prompt_logprobs_out(texts: TokenTexts, plps: list[TokenLogprob | None], k: int) -> PromptLogprobs:
    out: list = []
    for e in plps:
        if e is None:
            out.append(None)
            continue
        entry = {e.token_id: PromptLogprob(logprob=clamp(e.logprob), rank=e.rank, decoded_token=texts.text(e.token_id))}
        for rank, (tid, v) in enumerate(e.top[:k], start=1):
            if tid not in entry:
                entry[tid] = PromptLogprob(logprob=clamp(v), rank=rank, decoded_token=texts.text(tid))
        out.append(entry)
    return out
