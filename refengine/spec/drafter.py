"""``Drafter``: each step's drafts, the load-aware back-off, and the acceptance counters. No torch.

Called by the engine at the start of ``step`` (before the scheduler), with the running requests:

- a request *drafts* when it asked for speculation (``SamplingParams.speculative``, else the
  server default), is one token behind (``num_computed_tokens == num_tokens - 1``: decoding, its
  prompt done), and is not a scoring request (``forced_ids``);
- the most drafted tokens per request come from the batch size (``SpecConfig.max_draft``: vLLM's
  ``num_speculative_tokens_per_batch_size``): the back-off. Past the last range nothing is drafted,
  so under load a step is exactly what it is without speculation;
- a draft never reaches past ``max_tokens`` or the context (the tokens it could produce, bonus
  included, fit).

``suffix``: the request's own ``TokenIndex`` (prompt + output so far, caught up each step) and the
engine's ``OutputCorpus`` each propose their longest-match continuation (``min_match``: the shortest
suffix matched, 2 by default; 1, a suffix tree's first level, drafted more and served slower:
results/spec/README.md, round 2); the one with the higher score wins (ties: the request's own). Its length is adapted to the match: at most
``ceil(max_spec_factor * match length)`` tokens, each kept while its estimated probability stays
>= ``min_token_prob``. ``ngram``: the request's own tokens, the longest match of
``prompt_lookup_min..prompt_lookup_max`` tokens, and the tokens that followed its most recent
occurrence (a fixed-length draft, as vLLM's prompt lookup).

Counters (vLLM's ``spec_decode_*`` meanings): drafts (verification steps with at least one drafted
token), draft tokens, accepted tokens, accepted tokens per draft position.
"""

from __future__ import annotations

import math

from refengine.outputs import SpecDecodeStats
from refengine.spec.config import SpecConfig
from refengine.spec.corpus import OutputCorpus
from refengine.spec.index import TokenIndex


class Drafter:
    def __init__(self, config: SpecConfig) -> None:
        self.config = config
        c = config
        self.corpus = OutputCorpus(c.suffix_decoding_max_cached_requests, c.suffix_decoding_corpus_tokens) \
            if c.method == "suffix" and c.suffix_decoding_max_cached_requests > 0 else None
        self._index: dict[str, TokenIndex] = {}
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.accepted_per_pos = [0] * c.num_speculative_tokens
        self.min_match = 2                     # shortest suffix matched (studies/spec_policy.py tries 1)
        self.steps_backed_off = 0              # steps where the batch size allowed no draft at all

    # ---- drafting ----------------------------------------------------------------
    def propose(self, running: list, enabled_by_default: bool) -> None:
        """Set ``spec_token_ids`` of every running request (empty when it drafts nothing this step)."""
        k_max = self.config.max_draft(len(running))
        if k_max == 0 and running:
            self.steps_backed_off += 1
        for req in running:
            req.spec_token_ids = self._draft(req, k_max) if k_max and self._wants(req, enabled_by_default) else []

    @staticmethod
    def _wants(req, default: bool) -> bool:
        want = req.params.speculative
        # Constrained requests draft too: each draft position's row is masked by the grammar after the
        # drafts before it (refengine.structured.masks).
        return (default if want is None else want) and req.forced_ids is None \
            and req.num_computed_tokens == req.num_tokens - 1 and req.prefilled

    def _draft(self, req, k_max: int) -> list[int]:
        room = min(req.params.max_tokens - req.num_output_tokens - 1, req.max_model_len - req.num_tokens)
        k = min(k_max, room)
        if k <= 0:
            return []
        c = self.config
        idx = self._index.get(req.request_id)
        if idx is None or idx.tokens is not req.token_ids:
            idx = self._index[req.request_id] = TokenIndex(req.token_ids)
        idx.extend()
        if c.method == "ngram":
            m, starts = idx.match(req.token_ids, c.prompt_lookup_max, c.prompt_lookup_min)
            if not m:
                return []
            s = starts[0]
            return req.token_ids[s:s + k]
        depth = c.suffix_decoding_max_tree_depth
        pattern = req.token_ids[-depth:]
        best, best_score = [], 0.0
        m, starts = idx.match(pattern, depth, min_len=self.min_match)
        if m:
            best, best_score = idx.continuation(starts, self._length(m, k), c.suffix_decoding_min_token_prob)
        if self.corpus is not None:
            m2, draft, score = self.corpus.lookup(pattern, depth, lambda n: self._length(n, k),
                                                  c.suffix_decoding_min_token_prob, self.min_match)
            if m2 and score > best_score:
                best = draft
        return best

    def _length(self, match_len: int, k: int) -> int:
        return min(k, math.ceil(self.config.suffix_decoding_max_spec_factor * match_len))

    # ---- feedback ----------------------------------------------------------------
    def record(self, drafted: int, accepted: int) -> None:
        """One verification step of one request: ``drafted`` tokens proposed, the first ``accepted`` kept."""
        if drafted <= 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += drafted
        self.num_accepted_tokens += accepted
        for pos in range(min(accepted, len(self.accepted_per_pos))):
            self.accepted_per_pos[pos] += 1

    def finished(self, req) -> None:
        """A request left the engine: its index goes; a finished output joins the corpus."""
        self._index.pop(req.request_id, None)
        if self.corpus is not None and req.status.value in ("stop", "length"):
            self.corpus.add(req.output_token_ids)

    def counts(self) -> SpecDecodeStats:
        return SpecDecodeStats(self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens,
                               list(self.accepted_per_pos))

    def stats(self) -> dict[str, float]:
        """Our own figures besides vLLM's counters (``/metrics`` prefixes them ``swiftserve_worker_``)."""
        out = {"spec_decode_backed_off_steps_total": float(self.steps_backed_off)}
        if self.corpus is not None:
            out["spec_decode_corpus_outputs"] = float(self.corpus.num_outputs)
            out["spec_decode_corpus_tokens"] = float(self.corpus.num_tokens)
        return out
