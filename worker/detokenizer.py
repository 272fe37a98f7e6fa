"""Incremental detokenisation and stop strings, one ``OutputText`` per choice.

``IncrementalDetokenizer`` turns a growing list of token ids into text deltas.
It decodes a small window twice (``ids[prefix:read]`` and ``ids[prefix:]``) and
emits the difference, so leading-space rules of SentencePiece / byte-level BPE
tokenizers come out right. Invariant: text is emitted only when the decoded
window does not end in U+FFFD, i.e. a multi-byte UTF-8 character split over
several byte tokens is withheld until its last byte arrives (on ``flush`` at the
end of the request, an unfinished character is emitted as U+FFFD, as a full
decode would). The concatenated deltas equal ``tokenizer.decode(all_output_ids)``
for byte-level tokenizers.

``StopStringMatcher`` applies stop strings to that text stream: it stops as soon
as a stop string appears (also across deltas) and withholds the longest tail that
could still be the start of a stop string, so the client never sees text that a
later stop would have cut. ``include_stop_str_in_output`` keeps the stop string.

Cost: every token decodes two windows of a few tokens (microseconds with a fast
tokenizer), so this runs on the event loop.
"""

from __future__ import annotations

from dataclasses import dataclass

# Prompt tokens kept as left context of the first window (leading-space rules need some).
_CONTEXT_TOKENS = 5
_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_token_ids: list[int], skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        tail = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self._ids: list[int] = tail     # window: ids[prefix_offset:] of the full sequence, trimmed
        self._prefix = 0                # start of the decoded window inside _ids
        self._read = len(tail)          # end of what has already been emitted

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens,
                                     clean_up_tokenization_spaces=False)

    def add(self, token_id: int) -> str:
        """Append one token; return the newly stable text (often "", never a split character)."""
        self._ids.append(token_id)
        return self._emit(final=False)

    def flush(self) -> str:
        """End of the request: emit whatever is still withheld."""
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        if self._read >= len(self._ids):
            return ""
        prefix_text = self._decode(self._ids[self._prefix:self._read])
        full_text = self._decode(self._ids[self._prefix:])
        if len(full_text) <= len(prefix_text) and not final:
            return ""           # e.g. a skipped special token, or bytes that do not make a character yet
        if full_text.endswith(_REPLACEMENT) and not final:
            return ""
        delta = full_text[len(prefix_text):]
        # Slide the window: the emitted window becomes the left context of the next.
        self._ids = self._ids[self._read:]
        self._prefix = 0
        self._read = len(self._ids)
        return delta


class StopStringMatcher:
    def __init__(self, stops: tuple[str, ...] | list[str], include_stop_str: bool = False) -> None:
        self.stops = tuple(s for s in stops if s)
        self.include = include_stop_str
        self._pending = ""      # text received but not yet released
        self.hit: str | None = None

    def feed(self, text: str, check: bool = True) -> str:
        """Add text; return what may be released now. After a hit, returns "" forever.

        ``check=False`` (before ``min_tokens``) releases everything without matching."""
        if self.hit is not None:
            return ""
        if not self.stops:
            return text
        self._pending += text
        if not check:
            out, self._pending = self._pending, ""
            return out
        best: tuple[int, int, str] | None = None      # (position, -length, stop): earliest, then longest
        for s in self.stops:
            i = self._pending.find(s)
            if i >= 0 and (best is None or (i, -len(s)) < best[:2]):
                best = (i, -len(s), s)
        if best is not None:
            i, _, s = best
            self.hit = s
            out = self._pending[: i + len(s)] if self.include else self._pending[:i]
            self._pending = ""
            return out
        keep = self._partial_tail_len()
        cut = len(self._pending) - keep
        out, self._pending = self._pending[:cut], self._pending[cut:]
        return out

    def flush(self) -> str:
        out, self._pending = ("" if self.hit is not None else self._pending), ""
        return out

    def _partial_tail_len(self) -> int:
        """Length of the longest suffix of the pending text that is a proper prefix of a stop string.
        Only the places where a stop string's first character occurs are tried (``str.find``), longest
        first: the cost follows the pending text, not the stop strings' lengths."""
        text, n, best = self._pending, len(self._pending), 0
        for s in self.stops:
            i = text.find(s[0], n - min(len(s) - 1, n))
            while i != -1 and n - i > best:
                if s.startswith(text[i:]):
                    best = n - i
                    break
                i = text.find(s[0], i + 1)
        return best


@dataclass
class TextDelta:
    text: str
    stop_string: str | None = None   # set when a stop string ended the choice


class OutputText:
    """Detokenizer + stop strings for one choice. ``text`` is everything released so far."""

    def __init__(self, tokenizer, prompt_token_ids: list[int], stops: tuple[str, ...] = (),
                 include_stop_str: bool = False, min_tokens: int = 0, skip_special_tokens: bool = True) -> None:
        self.detok = IncrementalDetokenizer(tokenizer, prompt_token_ids, skip_special_tokens)
        self.matcher = StopStringMatcher(stops, include_stop_str)
        self.min_tokens = min_tokens
        self.num_tokens = 0
        self.text = ""

    @property
    def stopped(self) -> bool:
        return self.matcher.hit is not None

    def add_tokens(self, token_ids: list[int]) -> TextDelta:
        parts = []
        for tid in token_ids:
            self.num_tokens += 1
            piece = self.detok.add(tid)
            if piece:
                parts.append(self.matcher.feed(piece, check=self.num_tokens >= self.min_tokens))
            if self.matcher.hit is not None:
                break
        return self._released("".join(parts))

    def finish(self) -> TextDelta:
        """No more tokens: release the withheld tails (an incomplete character, a partial stop)."""
        if self.matcher.hit is not None:
            return self._released("")
        out = self.matcher.feed(self.detok.flush(), check=self.num_tokens >= self.min_tokens)
        return self._released(out + self.matcher.flush())

    def _released(self, text: str) -> TextDelta:
        self.text += text
        return TextDelta(text, self.matcher.hit)
