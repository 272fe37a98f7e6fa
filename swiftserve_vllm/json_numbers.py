"""The reference engine's JSON number cap on vLLM: a vLLM logits processor.

``refengine.structured.numbers`` explains the rule: inside a JSON number's fraction, after 17
significant digits (what a double carries), tokens that start with a digit are not offered, so
a small model's sampled digit loop (``0.99999999999999999919999...`` until ``max_tokens``) ends
instead of cutting the output. The worker's ``--engine vllm`` adds ``JsonNumberCap`` to the
engine's ``logits_processors``; it acts only on requests whose structured output is JSON (a
schema or ``json_object``).

vLLM applies the grammar's bitmask to the logits before its logits processors run, so a row
where the cap would leave no finite logit (the grammar allows only digits) is left alone, as
on the reference engine. Per-request state follows vLLM's persistent batch (``BatchUpdate``:
removed, then added, then moved); ``output_tok_ids`` is vLLM's live list of the request's
output tokens, fed to the request's ``JsonNumberState`` as far as it has grown.
"""

from __future__ import annotations

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from refengine.structured.numbers import JsonNumberState


class _Tracked:
    __slots__ = ("out", "consumed", "numbers")

    def __init__(self, out: list[int]) -> None:
        self.out, self.consumed, self.numbers = out, 0, JsonNumberState()


def _is_json(params) -> bool:
    so = getattr(params, "structured_outputs", None)
    return so is not None and (so.json is not None or bool(getattr(so, "json_object", None)))


class JsonNumberCap(LogitsProcessor):
    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        import llguidance.hf
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(vllm_config.model_config.tokenizer)
        self._ll = llguidance.hf.from_tokenizer(tok)
        vocab = vllm_config.model_config.get_vocab_size()
        digits = [t for t in range(min(vocab, self._ll.vocab_size))
                  if (b := self._ll.decode_bytes([t])) and 0x30 <= b[0] <= 0x39]
        self._digit_ids = torch.tensor(digits, dtype=torch.long, device=device)
        self._reqs: dict[int, _Tracked] = {}

    def is_argmax_invariant(self) -> bool:
        return False                      # it can change the greedy token

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for i in batch_update.removed:
            self._reqs.pop(i, None)
        for i, params, _prompt, out in batch_update.added:
            if _is_json(params):
                self._reqs[i] = _Tracked(out)
            else:
                self._reqs.pop(i, None)
        for a, b, how in batch_update.moved:
            ra, rb = self._reqs.pop(a, None), self._reqs.pop(b, None)
            if ra is not None:
                self._reqs[b] = ra
            if rb is not None and how == MoveDirectionality.SWAP:
                self._reqs[a] = rb

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for i, r in self._reqs.items():
            if len(r.out) > r.consumed:
                r.numbers.feed(self._ll.decode_bytes(r.out[r.consumed:]))
                r.consumed = len(r.out)
            if r.numbers.capped and i < logits.shape[0]:
                row = logits[i].clone()
                row[self._digit_ids] = float("-inf")
                if bool(torch.isfinite(row).any()):
                    logits[i] = row
        return logits
