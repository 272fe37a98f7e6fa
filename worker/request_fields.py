"""How request fields we do not implement are treated: vLLM's own are refused, never dropped.

Three kinds of field reach the worker:

1. Fields declared in the API's request model (``worker.api.<api>.protocol``): each takes
   effect or is refused with a 400 naming it (``worker.api.sampling.validate_sampling`` and
   the API's own checks).
2. vLLM's request fields (its completion and chat protocol, vLLM 0.32) that we have not
   built: listed in ``VLLM_UNIMPLEMENTED`` with the value that means "off". A request
   that sets one to anything else gets a 400 naming it, because a client switching from
   ``vllm serve`` expects it to act; sending the "off" value (some clients send every
   default) is accepted.
3. Anything else (other vendors' extras, OpenAI fields without an effect on generation
   such as ``metadata`` or ``store``): accepted and ignored, as vLLM does with fields it
   does not know. Identifiers (``user``, ``request_id``, ``session_id``) only name the
   caller or the request and are accepted.

``pop_unimplemented`` runs in a ``mode="before"`` validator, so the refusal can name the
field even though pydantic would otherwise drop the key.
"""

from __future__ import annotations

from typing import Any

_OFF_FLAG = (None, False)

# vLLM field -> the values meaning "not used" (what vLLM's defaults are).
VLLM_UNIMPLEMENTED: dict[str, tuple[Any, ...]] = {
    "use_beam_search": _OFF_FLAG,
    "length_penalty": (None, 1.0),
    "watermarking": _OFF_FLAG,
    "spaces_between_special_tokens": (None, True),
    "truncation_side": (None, "left"),          # "left" (keep the last tokens) is what truncate_prompt_tokens does
    "allowed_token_ids": (None,),
    "logprob_token_ids": (None,),
    "bad_words": (None, ()),
    "prompt_embeds": (None,),
    "priority": (None, 0),
    "return_tokens_as_token_ids": _OFF_FLAG,
    "return_token_offsets": _OFF_FLAG,
    "return_prompt_text": _OFF_FLAG,
    "routed_experts_prompt_start": (None, 0),
    "mm_payload": (None,),
    "return_mm_kwargs": _OFF_FLAG,
    "media_io_kwargs": (None,),
    "mm_processor_kwargs": (None,),
    "documents": (None,),
    "cache_salt": (None,),
    "kv_transfer_params": (None,),
    "ec_transfer_params": (None,),
    "vllm_xargs": (None,),
    "repetition_detection": (None,),
    "thinking_token_budget": (None,),
    "stream_interval": (None, 1),
    "logits_processors": (None,),
    "guided_decoding_backend": (None,),         # the server picks the grammar library
}
# Chat only: vLLM's chat ``echo`` (repeat the last message). Completions implement ``echo``.
VLLM_UNIMPLEMENTED_CHAT: dict[str, tuple[Any, ...]] = {"echo": _OFF_FLAG}


def _is_off(value: Any, off: tuple[Any, ...]) -> bool:
    if isinstance(value, (list, tuple, dict)) and len(value) == 0:
        return any(o in ((), None) for o in off)
    for o in off:
        if isinstance(value, bool) or isinstance(o, bool) or o is None:
            if value is o:
                return True
        elif isinstance(value, (int, float, str)) and value == o:
            return True
    return False


def pop_unimplemented(data: Any, chat: bool) -> tuple[Any, list[str]]:
    """``data`` (the raw body) without the vLLM-only fields we do not implement, and the names of
    those set to something other than "off", in body order."""
    if not isinstance(data, dict):
        return data, []
    data = dict(data)
    table = VLLM_UNIMPLEMENTED | (VLLM_UNIMPLEMENTED_CHAT if chat else {})
    given = []
    for name in [k for k in data if k in table]:
        value = data.pop(name)
        if not _is_off(value, table[name]):
            given.append(name)
    return data, given
