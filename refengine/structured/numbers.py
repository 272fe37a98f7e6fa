"""JSON number precision cap: a fraction stops offering digits after 17 significant digits.

Why: a JSON grammar lets a number's fraction run on forever, and a small model sampled at
temperature 0.7 sometimes does (``0.54228000000000017522800353142661875...`` until
``max_tokens``), so a schema it could satisfy ends cut and invalid. A double carries at
most 17 significant decimal digits and every double has a representation of 17 or fewer,
so digits past the 17th change nothing for a client that parses numbers as doubles (JSON
parsers in Python, JavaScript, Go and Java's defaults do): the cap removes no value a
client can receive. It applies only inside a fraction (after ``.``, before any exponent):
integers, whatever their length (IDs as JSON integers), and strings are untouched.

``JsonNumberState`` follows one constrained JSON output byte by byte (strings and their
escapes, numbers); ``capped`` says the next token must not start with a digit.
``digit_start_words(tokenizer, vocab)`` is the bitmask (the masks' int32 word layout) of
tokens whose text starts with a digit, cleared from a capped row's mask, unless that would
leave the row nothing to sample (then the grammar's own mask stands).
"""

from __future__ import annotations

import torch

MAX_SIGNIFICANT = 17
_DIGITS = frozenset(b"0123456789")


class JsonNumberState:
    __slots__ = ("in_string", "escape", "in_number", "in_fraction", "in_exponent", "significant")

    def __init__(self) -> None:
        self.in_string = self.escape = False
        self.in_number = self.in_fraction = self.in_exponent = False
        self.significant = 0

    def feed(self, data: bytes) -> None:
        for b in data:
            if self.in_string:
                if self.escape:
                    self.escape = False
                elif b == 0x5C:                       # backslash
                    self.escape = True
                elif b == 0x22:                       # closing quote
                    self.in_string = False
                continue
            if self.in_number:
                if b in _DIGITS:
                    if not self.in_exponent and (self.significant or b != 0x30):
                        self.significant += 1       # leading zeros are not significant
                    continue
                if b == 0x2E:                         # "."
                    self.in_fraction = True
                    continue
                if b in (0x65, 0x45):                 # "e" / "E"
                    self.in_exponent = True
                    continue
                if b in (0x2B, 0x2D) and self.in_exponent:
                    continue
                self.in_number = self.in_fraction = self.in_exponent = False
            if b == 0x22:
                self.in_string = True
            elif b in _DIGITS or b == 0x2D:           # a number starts
                self.in_number, self.in_fraction, self.in_exponent = True, False, False
                self.significant = 1 if b in _DIGITS and b != 0x30 else 0

    @property
    def capped(self) -> bool:
        return self.in_number and self.in_fraction and not self.in_exponent and self.significant >= MAX_SIGNIFICANT


def digit_start_words(tokenizer, vocab_size: int) -> torch.Tensor:
    """[ceil(V/32)] int32: bit ``t % 32`` of word ``t // 32`` set when token ``t``'s bytes start with a digit."""
    words = [0] * ((vocab_size + 31) // 32)
    for t in range(vocab_size):
        data = tokenizer.decode_bytes([t])
        if data and data[0] in _DIGITS:
            words[t // 32] |= 1 << (t % 32)
    return torch.tensor([w - (1 << 32) if w >= 1 << 31 else w for w in words], dtype=torch.int32)


def cap_row(row: torch.Tensor, digit_words: torch.Tensor) -> None:
    """Clears the digit-starting tokens from one mask row in place, unless none would be left."""
    capped = row & ~digit_words
    if bool(capped.any()):
        row.copy_(capped)
