"""Acceptance of drafted tokens from one forward pass (torch).

A request that drafted ``d_0 .. d_{k-1}`` has ``k + 1`` rows of logits in the step: row ``i`` is
the model's distribution for the token after ``d_{i-1}`` (row 0: after its last real token). Each
row is processed like any sampling row (logit bias, penalties over the tokens before it, drafts
included, ``min_tokens`` blocking by its output position, the grammar's mask after the drafts
before it), so row ``i`` is exactly what a step without speculation would see had ``d_0..d_{i-1}``
been sampled.

- Greedy rows: ``d_i`` is accepted while it equals the row's argmax; the first row that disagrees
  gives its argmax (the correction), or, all accepted, the last row gives the bonus token. The
  output is the token sequence greedy decoding without speculation produces.
- Random rows: the standard rejection rule (Leviathan et al.; Chen et al.) for a draft that is a
  point mass (model-free drafts have no distribution: ``q(d_i) = 1``): accept ``d_i`` with
  probability ``min(1, p_i(d_i) / q(d_i)) = p_i(d_i)``; on rejection draw from the residual
  ``max(0, p_i - q_i)`` normalised, i.e. ``p_i`` without ``d_i``; all accepted, draw the bonus from
  ``p_k``. Each emitted token is distributed as ``p`` of its position: outputs keep their
  distribution. Uniforms come from the request's own generator (a seed makes a speculative request
  reproducible; it draws a different stream than without speculation).

``accept`` returns, per group, the emitted tokens (accepted drafts + one more) and their logprobs
when the request asked for them (of the raw model distribution at each emitted token's row).
"""

from __future__ import annotations

import torch

from refengine.outputs import TokenLogprob
from refengine.sampler import SampleRow, draw, process_logits, random_probs, row_logprobs


def accept(logits: torch.Tensor, rows: list[SampleRow], groups: list[tuple[int, list[int]]],
           default_gen: torch.Generator | None, masks=None) -> list[tuple[list[int], list[TokenLogprob] | None]]:
    """``logits [N, V]`` of the step's sampling rows; ``groups``: ``(first row, drafts)`` per request, its rows
    ``first .. first + len(drafts)`` -> ``(tokens, logprobs or None)`` per group."""
    raw, proc = process_logits(logits, rows, masks)
    argmax = proc.argmax(-1).tolist()
    rand = [i for i, r in enumerate(rows) if not r.params.greedy]
    probs = dict(zip(rand, random_probs(proc, rows, rand))) if rand else {}
    out = []
    emitted: dict[int, int] = {}                 # row -> the token emitted from it (for logprobs)
    for first, drafts in groups:
        toks: list[int] = []
        if rows[first].params.greedy:
            a = 0
            while a < len(drafts) and argmax[first + a] == drafts[a]:
                a += 1
            toks = drafts[:a] + [argmax[first + a]]
        else:
            gen = rows[first].generator or default_gen
            for i, d in enumerate(drafts):
                p = probs[first + i]
                u = torch.empty(1, dtype=torch.float64).uniform_(generator=gen)
                if float(u) < float(p[d]):
                    toks.append(d)
                    continue
                resid = p.clone()
                resid[d] = 0.0
                toks.append(draw(resid, gen))   # p(d) < 1 here, so the residual has mass
                break
            else:
                toks.append(draw(probs[first + len(drafts)], gen))
        for i, t in enumerate(toks):
            emitted[first + i] = t
        out.append(toks)
    lps = row_logprobs(raw, rows, emitted)
    return [(toks, [lps[first + i] for i in range(len(toks))] if rows[first].params.logprobs is not None else None)
            for (first, _), toks in zip(groups, out)]
