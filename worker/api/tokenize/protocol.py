"""The /tokenize and /detokenize requests (vLLM's shapes).

/tokenize takes exactly one of ``prompt`` (text) and chat ``messages`` (with chat's template
fields and ``tools``); ``add_special_tokens`` unset means true for a prompt, false for messages
(vLLM). /detokenize takes ``tokens``: integers, not ``"1"`` or ``true``. ``model`` is optional.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, StrictInt, model_validator

from worker.api.base_request import BaseRequest
from worker.api.chat.protocol import ChatMessage


class TokenizeRequest(BaseRequest):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    add_special_tokens: bool | None = None          # None: true for a prompt, false for messages (vLLM)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool | None = False
    tools: list[dict[str, Any]] | None = None

    @model_validator(mode="after")
    def _one_input(self) -> "TokenizeRequest":
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt and messages")
        return self


class DetokenizeRequest(BaseRequest):
    model: str | None = None
    tokens: list[StrictInt]             # ids, not "1" or true
