"""``OutputCorpus``: the bounded global store of recent outputs, per engine (one model). No torch.

Suffix decoding's second source of drafts (ArcticInference's global tree): what earlier requests
generated. Agent loops, templated answers and repeated extractions produce the same spans again;
a request whose last tokens match a stored output is offered what followed them there.

One ``TokenIndex`` over the outputs joined by ``SEPARATOR`` (so no match or continuation crosses
from one output into the next). Bounded two ways, oldest output first out: at most
``max_requests`` outputs (vLLM's ``suffix_decoding_max_cached_requests``) and at most
``max_tokens`` tokens (``suffix_decoding_corpus_tokens``). Evicted outputs are dropped logically
(``TokenIndex.base`` moves past them: lookups stop there) and physically when they make up half
the stored list (one re-index of what is left, amortised over that many added tokens).
"""

from __future__ import annotations

from collections import deque

from refengine.spec.index import SEPARATOR, TokenIndex


class OutputCorpus:
    def __init__(self, max_requests: int, max_tokens: int) -> None:
        self.max_requests = max_requests
        self.max_tokens = max_tokens
        self.index = TokenIndex()
        self.starts: deque[int] = deque()      # list offset of each stored output's separator, oldest first
        self.offset = 0                        # absolute position of tokens[0] (moves at compaction)

    @property
    def num_outputs(self) -> int:
        return len(self.starts)

    @property
    def num_tokens(self) -> int:
        """Stored tokens (separators included) of the live outputs."""
        return len(self.index.tokens) - (self.starts[0] if self.starts else len(self.index.tokens))

    def add(self, output: list[int]) -> None:
        """Store one finished request's output (at least 2 tokens: shorter ones can draft nothing)."""
        if len(output) < 2 or self.max_requests == 0 or self.max_tokens == 0:
            return
        output = output[-self.max_tokens + 1:] if len(output) >= self.max_tokens else output
        t = self.index.tokens
        self.starts.append(len(t))
        t.append(SEPARATOR)
        t.extend(output)
        self.index.extend()
        while self.starts and (len(self.starts) > self.max_requests or self.num_tokens > self.max_tokens):
            self.starts.popleft()
            self.index.base = self.starts[0] if self.starts else len(t)
        if self.index.base > len(t) // 2:
            self._compact()

    def _compact(self) -> None:
        cut = self.index.base
        fresh = TokenIndex(self.index.tokens[cut:])
        fresh.extend()
        self.index = fresh
        self.starts = deque(s - cut for s in self.starts)

    def lookup(self, pattern: list[int], max_depth: int, max_len, min_prob: float, min_len: int = 1
               ) -> tuple[int, list[int], float]:
        """``(match length, draft, score)`` for a request whose last tokens are ``pattern``;
        ``max_len(match length)`` bounds the draft."""
        m, starts = self.index.match(pattern, max_depth, min_len=min_len)
        if not m:
            return 0, [], 0.0
        draft, score = self.index.continuation(starts, max_len(m), min_prob)
        return m, draft, score
