"""Prompt logprobs from the prefill pass: which rows of a step need the LM head, and the
sliced head + log-softmax over them.

Contract. A request with ``params.prompt_logprobs = k`` gets, for every prompt position
``p < num_prompt - 1``, the logprob of prompt token ``p + 1`` under the model's
distribution at ``p``, the ``k`` best alternatives and, with ``prompt_logprob_ranks``,
its rank (``TokenLogprob``),
stored in ``Request.prompt_lps[p + 1]``. They come from the rows the prefill computes
anyway; nothing runs a second pass. Per chunk the rows that go on to the head form one
contiguous suffix of the chunk (``head_rows``): the prompt positions not scored yet, then
the sampling row when the chunk samples. With SwiftKV those rows also run the later
layers (the only extra cost of asking).

Memory: logits of a prompt are never held whole. ``score_rows`` applies the head to at
most ``SLICE_ROWS`` rows at a time (``[SLICE_ROWS, vocab]`` float32: 48 MiB for a
49k vocabulary) and keeps only the gathered values.

Idempotent: entries are assigned by position, so a step re-run by the engine's failure
isolation writes the same entries again instead of appending twice.
"""

from __future__ import annotations

import torch

from refengine.outputs import TokenLogprob

SLICE_ROWS = 256


def head_rows(start: int, end: int, num_prompt: int, prompt_lps: list | None, samples: bool) -> int:
    """First position of the chunk ``[start, end)`` whose row goes on to the LM head (``end``: none)."""
    lo = end
    if prompt_lps is not None and len(prompt_lps) < num_prompt:
        lo = max(start, len(prompt_lps) - 1)          # next position not scored yet
    if samples:
        lo = min(lo, end - 1)
    return lo


def scored_positions(lo: int, end: int, num_prompt: int, prompt_lps: list | None) -> int:
    """How many of the head rows ``[lo, end)`` are prompt positions to score (they come first)."""
    if prompt_lps is None or len(prompt_lps) >= num_prompt:
        return 0
    return max(0, min(end, num_prompt - 1) - lo)


@torch.no_grad()
def score_rows(head, hidden: torch.Tensor, targets: list[int], k: int, ranks: bool) -> list[TokenLogprob]:
    """``hidden [n, D]`` final-normed rows, ``targets[i]`` the token that follows row i ->
    one ``TokenLogprob`` per row (logprob of the target, the ``k`` best, and the target's rank
    when ``ranks``: a count over the vocabulary, about as costly as the log-softmax)."""
    out: list[TokenLogprob] = []
    tgt_all = torch.tensor(targets, dtype=torch.long, device=hidden.device)
    for s in range(0, hidden.shape[0], SLICE_ROWS):
        logp = torch.log_softmax(head(hidden[s:s + SLICE_ROWS]).float(), dim=-1)     # [m, V]
        tgt = tgt_all[s:s + SLICE_ROWS]
        tok = logp.gather(1, tgt.unsqueeze(1))                                       # [m, 1]
        rank = (logp > tok).sum(-1, dtype=torch.int32).add_(1).tolist() if ranks else [None] * len(tgt)
        vals = ids = None
        if k > 0:
            vals, ids = logp.topk(k, dim=-1)
            vals, ids = vals.tolist(), ids.tolist()
        for j, (t, lp, rk) in enumerate(zip(tgt.tolist(), tok.squeeze(1).tolist(), rank)):
            top = list(zip(ids[j], vals[j])) if k > 0 else []
            out.append(TokenLogprob(t, lp, top, rk))
    return out
