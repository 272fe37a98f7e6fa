"""Token id -> its string and its bytes, cached per tokenizer: ``TokenTexts`` (for the logprob formats).

A token's string is ``decode([id])`` with special tokens kept. A byte-level BPE token that is
only part of a UTF-8 character decodes to U+FFFD; its ``bytes`` are then recovered from the
byte-level alphabet, so clients can reassemble text. One ``TokenTexts`` lives on the serving
state (``worker.serving.ServingState.token_texts``); ``worker.api.logprobs`` reads it.
"""

from __future__ import annotations

from functools import lru_cache


def _byte_level_decoder() -> dict[str, int]:
    """Inverse of the GPT-2 byte -> printable character table used by byte-level BPE."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars = list(keep)
    n = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(keep, chars, strict=True)}


_BYTE_DECODER = _byte_level_decoder()


class TokenTexts:
    """Cached id -> (string, bytes) for one tokenizer."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.lookup = lru_cache(maxsize=1 << 16)(self._compute)

    def _compute(self, token_id: int) -> tuple[str, tuple[int, ...]]:
        text = self.tokenizer.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        raw = text.encode("utf-8")
        if "\ufffd" in text:
            piece = self.tokenizer.convert_ids_to_tokens(token_id)
            if isinstance(piece, str) and piece and all(c in _BYTE_DECODER for c in piece):
                raw = bytes(_BYTE_DECODER[c] for c in piece)
        return text, tuple(raw)

    def text(self, token_id: int) -> str:
        return self.lookup(token_id)[0]

    def bytes(self, token_id: int) -> list[int]:
        return list(self.lookup(token_id)[1])
