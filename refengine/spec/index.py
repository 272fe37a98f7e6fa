"""``TokenIndex``: one growing token sequence, indexed for suffix matching. No torch.

The structure a suffix tree of bounded depth gives suffix decoding, built for Python's speed:
every position ``i >= 2`` is filed under the bigram ``(t[i-2], t[i-1])`` that precedes it, so the
occurrences of the sequence's last two tokens are one dict lookup; each occurrence is then
extended backwards to its match length (up to ``max_depth``). Every position ``i >= 1`` is also
filed under the token before it, for matches of length 1 (``match(..., min_len=1)``) when the last
bigram never occurred before: a suffix tree's first level. The occurrences with the longest
match are the deepest node of a suffix tree; the tokens that followed them are that node's
subtree, and ``continuation`` walks it the way suffix decoding does: at each depth the most
frequent next token, its estimated probability the product of ``count(child) / count(node)``
along the path, stopping below ``min_prob``.

Cost: ``extend`` is two dict appends per new token (a 2000-token prompt indexes in ~1 ms);
``match`` looks at the ``MAX_CANDIDATES`` most recent occurrences, ``max_depth`` comparisons each.

Positions are global offsets into ``tokens`` (a list the index may share with its owner: a
request's ``token_ids``; ``extend`` catches up with whatever was appended). ``OutputCorpus``
reuses it over several outputs joined by a separator that matches nothing.
"""

from __future__ import annotations

MAX_CANDIDATES = 48        # most recent occurrences of the last bigram that are extended
SEPARATOR = -1             # between documents of a corpus: never a token, so no match crosses it


class TokenIndex:
    __slots__ = ("tokens", "indexed", "table", "single", "base")

    def __init__(self, tokens: list[int] | None = None) -> None:
        self.tokens: list[int] = tokens if tokens is not None else []
        self.indexed = 1               # positions < indexed are filed (0 has no preceding token)
        self.table: dict[tuple[int, int], list[int]] = {}     # bigram before position i -> positions (i >= 2)
        self.single: dict[int, list[int]] = {}                # token before position i -> positions (i >= 1)
        self.base = 0                  # positions < base were dropped (a corpus evicts its oldest documents)

    def extend(self) -> None:
        """File every position appended since the last call (the last position is filed too: its
        continuation is read only once it exists, ``continuation`` checks the bounds)."""
        t, table, single = self.tokens, self.table, self.single
        n = len(t)
        for i in range(self.indexed, n):
            prev = t[i - 1]
            lst = single.get(prev)
            if lst is None:
                single[prev] = [i]
            else:
                lst.append(i)
            if i < 2:
                continue
            key = (t[i - 2], prev)
            lst = table.get(key)
            if lst is None:
                table[key] = [i]
            else:
                lst.append(i)
        self.indexed = max(self.indexed, n)

    def match(self, pattern: list[int], max_depth: int, min_len: int = 2, end: int | None = None
              ) -> tuple[int, list[int]]:
        """The longest suffix of ``pattern`` (at least ``min_len``, at most ``max_depth`` tokens) that occurs
        in the indexed tokens followed by at least one token before ``end`` (default: the sequence's end);
        returns ``(match length, positions right after each occurrence)``, most recent first, or ``(0, [])``."""
        if not pattern:
            return 0, []
        t = self.tokens
        stop = len(t) if end is None else end
        cands = self.table.get((pattern[-2], pattern[-1])) if len(pattern) >= 2 else None
        if not cands:
            return self._match_one(pattern[-1], stop) if min_len <= 1 else (0, [])
        best, found = 0, []
        seen = 0
        depth_cap = min(max_depth, len(pattern))
        for j in range(len(cands) - 1, -1, -1):
            i = cands[j]
            if i < self.base:
                break                                   # older ones were dropped
            if i >= stop:
                continue                                # no continuation yet (the pattern's own end)
            m = 2
            while m < depth_cap and i - m - 1 >= self.base and t[i - m - 1] == pattern[-m - 1]:
                m += 1
            if m > best:
                best, found = m, [i]
            elif m == best:
                found.append(i)
            seen += 1
            if seen >= MAX_CANDIDATES:
                break
        if best >= min_len:
            return best, found
        return self._match_one(pattern[-1], stop) if min_len <= 1 else (0, [])

    def _match_one(self, last: int, stop: int) -> tuple[int, list[int]]:
        """Match length 1: the ``MAX_CANDIDATES`` most recent positions that follow ``last``."""
        found = []
        for i in reversed(self.single.get(last, ())):
            if i < self.base:
                break
            if i < stop:
                found.append(i)
                if len(found) >= MAX_CANDIDATES:
                    break
        return (1, found) if found else (0, [])

    def continuation(self, starts: list[int], max_len: int, min_prob: float, end: int | None = None
                     ) -> tuple[list[int], float]:
        """Walk the continuations of the occurrences ``starts`` (positions of their first next token):
        at each depth the most frequent next token while the path's estimated probability stays
        >= ``min_prob``; returns the tokens and their score (the sum of the path probabilities: the
        expected number of them a verifier accepts, if the frequencies were the model's)."""
        t = self.tokens
        stop = len(t) if end is None else end
        out: list[int] = []
        prob, score = 1.0, 0.0
        live = starts
        for d in range(max_len):
            counts: dict[int, list[int]] = {}
            for s in live:
                p = s + d
                if p < stop:
                    tok = t[p]
                    if tok != SEPARATOR:
                        counts.setdefault(tok, []).append(s)
            if not counts:
                break
            tok, group = max(counts.items(), key=lambda kv: len(kv[1]))
            p_next = prob * len(group) / len(live)
            if p_next < min_prob:
                break
            prob = p_next
            score += prob
            out.append(tok)
            live = group
        return out, score
