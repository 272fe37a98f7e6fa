"""Batch sampling: penalties, temperature, top-k, top-p, min-p, per-request seeds, logprobs.

Input: logits ``[N, vocab]`` (one row per request that samples this step) and the
rows' parameters. Greedy rows take the argmax of the processed logits. Random rows
use the exponential-race trick (argmax of p / Exp(1)), drawn from the request's own
``torch.Generator`` when it has a seed, so a seeded request gives the same tokens
whatever else is in the batch. Logprobs are of the raw model distribution (before
penalties and temperature), as vLLM reports them by default.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from refengine.outputs import TokenLogprob
from refengine.sampling_params import SamplingParams


@dataclass
class SampleRow:
    params: SamplingParams
    token_ids: list[int]            # prompt + output so far (for penalties)
    num_prompt_tokens: int
    generator: torch.Generator | None
    blocked_ids: tuple[int, ...]    # ids masked out (EOS/stop ids before min_tokens)


def _apply_penalties(logits: torch.Tensor, rows: list[SampleRow]) -> None:
    for i, r in enumerate(rows):
        p = r.params
        if p.repetition_penalty != 1.0:
            ids = torch.tensor(sorted(set(r.token_ids)), device=logits.device)
            vals = logits[i, ids]
            logits[i, ids] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
        if p.presence_penalty or p.frequency_penalty:
            out = r.token_ids[r.num_prompt_tokens:]
            if out:
                ids, counts = torch.tensor(out, device=logits.device).unique(return_counts=True)
                logits[i, ids] -= p.frequency_penalty * counts.to(logits.dtype) + p.presence_penalty


def _filter(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Mask one row's logits [V] by top-k / top-p / min-p (after temperature)."""
    if p.top_k and p.top_k < logits.shape[-1]:
        kth = torch.topk(logits, p.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if p.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        # Keep the smallest prefix whose mass reaches top_p (always keep the best token).
        remove = probs.cumsum(-1) - probs >= p.top_p
        remove[0] = False
        logits = logits.masked_fill(torch.zeros_like(remove).scatter(0, order, remove), float("-inf"))
    if p.min_p > 0.0:
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < p.min_p * probs.max(), float("-inf"))
    return logits


def sample(logits: torch.Tensor, rows: list[SampleRow], default_gen: torch.Generator | None
           ) -> tuple[list[int], list[TokenLogprob | None]]:
    logits = logits.float()
    raw = logits
    need_lp = [r.params.logprobs is not None for r in rows]
    if any(r.params.repetition_penalty != 1.0 or r.params.presence_penalty or r.params.frequency_penalty
           or r.blocked_ids for r in rows):
        logits = logits.clone()
        _apply_penalties(logits, rows)
        for i, r in enumerate(rows):
            if r.blocked_ids:
                logits[i, list(r.blocked_ids)] = float("-inf")
    tokens: list[int] = []
    for i, r in enumerate(rows):
        p = r.params
        if p.greedy:
            tokens.append(int(torch.argmax(logits[i])))
            continue
        row = _filter(logits[i] / p.temperature, p)
        probs = row.softmax(-1)
        gen = r.generator if r.generator is not None else default_gen
        q = torch.empty_like(probs).exponential_(1.0, generator=gen)
        tokens.append(int(torch.argmax(probs / q)))
    lps: list[TokenLogprob | None] = [None] * len(rows)
    if any(need_lp):
        logp = torch.log_softmax(raw, dim=-1)
        for i, r in enumerate(rows):
            if not need_lp[i]:
                continue
            k = r.params.logprobs or 0
            top = []
            if k > 0:
                vals, ids = torch.topk(logp[i], k)
                top = [(int(t), float(v)) for t, v in zip(ids, vals)]
            lps[i] = TokenLogprob(tokens[i], float(logp[i, tokens[i]]), top)
    return tokens, lps
