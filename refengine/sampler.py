"""Batch sampling: logit bias, penalties, temperature, top-k, top-p, min-p, per-request seeds, logprobs.

Input: logits ``[N, vocab]`` (one row per request that samples this step) and the
rows' parameters. Greedy rows take the argmax of the processed logits. Random rows
use inverse-CDF sampling with one uniform number per row (float64 cumulative sums),
drawn from the request's own ``torch.Generator`` when it has a seed, so a seeded
request gives the same tokens whatever else is in the batch. Logprobs are of the raw model distribution (before
logit bias, penalties and temperature), as vLLM reports them by default. ``logit_bias`` (OpenAI's: token id ->
value added to its logit) is one indexed add over the whole batch. Structured outputs'
token masks (``TokenMasks``: packed bitmasks of the constrained rows, computed beside the
forward pass by ``refengine.structured.masks``) are unpacked and applied to all those rows
in one ``masked_fill``, after bias and penalties (so nothing can re-enable a masked token).

Top-p is exact without sorting the whole vocabulary: the nucleus is searched in the
row's ``NUCLEUS_PROBE`` most likely tokens, and only a row whose nucleus is larger
than that falls back to a full sort (a full sort of a 49k vocabulary costs ~6 ms a
row on CPU, more than the rest of a decode step's sampling).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from refengine.outputs import TokenLogprob
from refengine.sampling_params import SamplingParams

NUCLEUS_PROBE = 256


@dataclass
class SampleRow:
    params: SamplingParams
    token_ids: list[int]            # prompt + output so far (for penalties)
    num_prompt_tokens: int
    generator: torch.Generator | None
    blocked_ids: tuple[int, ...]    # ids masked out (EOS/stop ids before min_tokens)


def _apply_logit_bias(logits: torch.Tensor, rows: list[SampleRow]) -> None:
    """Add every row's ``logit_bias`` in one indexed add over the batch ``[N, V]``."""
    r_idx, t_idx, vals = [], [], []
    for i, r in enumerate(rows):
        for t, b in r.params.logit_bias:
            r_idx.append(i)
            t_idx.append(t)
            vals.append(b)
    dev = logits.device
    logits.index_put_((torch.tensor(r_idx, device=dev), torch.tensor(t_idx, device=dev)),
                      torch.tensor(vals, dtype=logits.dtype, device=dev), accumulate=True)


_BITS = torch.arange(32, dtype=torch.int32)


def _apply_token_masks(logits: torch.Tensor, masks, only: set[int] | None = None) -> None:
    """Forbid every token whose bit is 0 in its row's packed mask ``masks.bits`` [k, ceil(V/32)]
    (``only``: just these rows of the batch)."""
    pick = [j for j, r in enumerate(masks.rows) if only is None or r in only]
    if not pick:
        return
    vocab = logits.shape[-1]
    bits = masks.bits[pick].to(logits.device)
    allowed = ((bits.unsqueeze(-1) >> _BITS.to(bits.device)) & 1).view(len(pick), -1)[:, :vocab].bool()   # [k, V]
    idx = torch.tensor([masks.rows[j] for j in pick], device=logits.device)
    logits[idx] = logits[idx].masked_fill(~allowed, float("-inf"))


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
        if r.blocked_ids:
            logits[i, list(r.blocked_ids)] = float("-inf")


def _top_p_mask(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Boolean mask [V] of tokens outside the nucleus of one row (logits already tempered)."""
    probs = logits.softmax(-1)
    k = min(NUCLEUS_PROBE, probs.shape[-1])
    top, idx = probs.topk(k)
    if float(top.sum()) < top_p and k < probs.shape[-1]:
        top, idx = probs.sort(descending=True)            # nucleus wider than the probe: exact fallback
    # Keep the smallest prefix whose mass reaches top_p (the best token always stays).
    drop_sorted = (top.cumsum(-1) - top) >= top_p
    keep = torch.zeros_like(probs, dtype=torch.bool)
    keep[idx[~drop_sorted]] = True
    return ~keep


def _filter(logits: torch.Tensor, rows: list[SampleRow], idx: list[int]) -> torch.Tensor:
    """Temperature, top-k, top-p, min-p for the random rows ``idx`` -> filtered logits [len(idx), V]."""
    dev = logits.device
    sub = logits[idx] / torch.tensor([rows[i].params.temperature for i in idx], device=dev).unsqueeze(1)
    ks = [rows[i].params.top_k for i in idx]
    if any(0 < k < sub.shape[-1] for k in ks):
        kmax = max(k for k in ks if k < sub.shape[-1])
        vals = sub.topk(kmax, dim=-1).values
        for j, k in enumerate(ks):
            if 0 < k < sub.shape[-1]:
                sub[j] = sub[j].masked_fill(sub[j] < vals[j, k - 1], float("-inf"))
    for j, i in enumerate(idx):
        p = rows[i].params
        if p.top_p < 1.0:
            sub[j] = sub[j].masked_fill(_top_p_mask(sub[j], p.top_p), float("-inf"))
    min_ps = torch.tensor([rows[i].params.min_p for i in idx], device=dev)
    if bool((min_ps > 0).any()):
        probs = sub.softmax(-1)
        sub = sub.masked_fill(probs < (min_ps * probs.amax(-1)).unsqueeze(1), float("-inf"))
    return sub


def process_logits(logits: torch.Tensor, rows: list[SampleRow], masks=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(raw, processed)`` float32 logits ``[N, V]``: processed = raw + logit bias, penalties, token
    masks (the same tensor as raw when no row has any of them)."""
    logits = logits.float()
    raw = logits
    biased = any(r.params.logit_bias for r in rows)
    if masks is not None or biased or any(r.params.repetition_penalty != 1.0 or r.params.presence_penalty
                                          or r.params.frequency_penalty or r.blocked_ids for r in rows):
        logits = logits.clone()
        if biased:
            _apply_logit_bias(logits, rows)     # first, as vLLM: penalties see the biased logits
        _apply_penalties(logits, rows)
        if masks is not None:
            _apply_token_masks(logits, masks)
        _rescue_empty_rows(logits, raw, masks)
    return raw, logits


def _rescue_empty_rows(logits: torch.Tensor, raw: torch.Tensor, masks) -> None:
    """A row left with no possible token (every logit -inf or NaN: e.g. a huge ``repetition_penalty`` on
    the only tokens a grammar allows, or ``min_tokens`` blocking the EOS that ends a grammar) samples
    from the raw logits under its grammar's mask alone: the request's own options gave way, never
    its constraint (an argmax over -inf rows would pick token 0, whatever the grammar says)."""
    logits.nan_to_num_(nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))   # NaN only
    empty = torch.isneginf(logits).all(-1)
    if not bool(empty.any()):
        return
    rows = empty.nonzero().flatten()
    logits[rows] = raw[rows]
    if masks is not None:
        _apply_token_masks(logits, masks, only=set(rows.tolist()))


def random_probs(logits: torch.Tensor, rows: list[SampleRow], idx: list[int]) -> torch.Tensor:
    """The sampling distribution ``[len(idx), V]`` of the random rows ``idx`` (processed logits in)."""
    return _filter(logits, rows, idx).softmax(-1)


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from one row's distribution ``[V]``: inverse CDF with one float64 uniform, as ``sample``
    draws each random row (so a request draws the same token from the same generator state either way)."""
    cdf = probs.double().cumsum(-1)
    u = torch.empty(1, dtype=torch.float64, device=cdf.device).uniform_(generator=generator)
    return int(torch.searchsorted(cdf, u * cdf[-1:]).clamp_max(cdf.shape[-1] - 1))


def row_logprobs(raw: torch.Tensor, rows: list[SampleRow], tokens: dict[int, int]) -> dict[int, TokenLogprob]:
    """Logprobs (raw model distribution) of ``tokens[row]`` at those rows of ``raw [N, V]`` that want them."""
    want = [i for i in tokens if rows[i].params.logprobs is not None]
    out: dict[int, TokenLogprob] = {}
    if want:
        logp = torch.log_softmax(raw[want], dim=-1)
        for j, i in enumerate(want):
            k = rows[i].params.logprobs or 0
            top = []
            if k > 0:
                vals, ids = torch.topk(logp[j], k)
                top = [(int(t), float(v)) for t, v in zip(ids, vals)]
            out[i] = TokenLogprob(tokens[i], float(logp[j, tokens[i]]), top)
    return out


def sample(logits: torch.Tensor, rows: list[SampleRow], default_gen: torch.Generator | None, masks=None
           ) -> tuple[list[int], list[TokenLogprob | None]]:
    raw, logits = process_logits(logits, rows, masks)
    tokens = logits.argmax(-1).tolist()           # greedy rows keep these
    rand = [i for i, r in enumerate(rows) if not r.params.greedy]
    if rand:
        probs = random_probs(logits, rows, rand)
        cdf = probs.double().cumsum(-1)                                  # [n, V]
        u = torch.empty(len(rand), 1, dtype=torch.float64, device=cdf.device)
        for j, i in enumerate(rand):
            u[j].uniform_(generator=rows[i].generator or default_gen)
        picks = torch.searchsorted(cdf, u * cdf[:, -1:]).clamp_max(cdf.shape[-1] - 1)
        # A zero-probability token can only be hit on an exact tie with the previous cdf value.
        picks = picks.squeeze(1).tolist()
        for j, i in enumerate(rand):
            tokens[i] = picks[j]
    got = row_logprobs(raw, rows, dict(enumerate(tokens)))
    return tokens, [got.get(i) for i in range(len(rows))]
