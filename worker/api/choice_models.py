"""The output models of the choice-based APIs, completions and chat: what those endpoints return.

``extra="forbid"``: a field an answer carries is one declared here, so a typo in a formatter
fails its test instead of reaching a client. Chat and completions, whole answers with usage
and logprobs (OpenAI's shape; ``prompt_logprobs`` and ``token_ids`` in vLLM's); a stream's
chunks carry the same choice fields (``worker.api.driver.ChoicesFormatter.chunk``). Their
requests are ``worker.api.completions.protocol`` and ``worker.api.chat.protocol``; the Responses
API's output is ``worker.api.responses.models``.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer


class _Response(BaseModel):
    model_config = ConfigDict(extra="forbid")


def now() -> int:
    return int(time.time())


class UsageInfo(_Response):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class CompletionLogprobs(_Response):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class PromptLogprob(_Response):
    """vLLM's per-token entry of ``prompt_logprobs`` (keyed by token id)."""
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


PromptLogprobs = list[dict[int, PromptLogprob] | None]


class _TokenIdsChoice(_Response):
    """A choice whose ``token_ids`` appear only when asked for (``return_token_ids``)."""
    token_ids: list[int] | None = None

    @model_serializer(mode="wrap")
    def _drop_absent_ids(self, handler):
        out = handler(self)
        if out.get("token_ids", 0) is None:
            del out["token_ids"]
        return out


class CompletionChoice(_TokenIdsChoice):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: PromptLogprobs | None = None


class _Answer(_Response):
    """The envelope of a whole answer; a subclass narrows ``object`` and ``choices`` (the fields keep this
    order on the wire)."""
    id: str
    object: str
    created: int = Field(default_factory=now)
    model: str
    choices: list[Any]
    usage: UsageInfo
    system_fingerprint: str | None = None


class CompletionResponse(_Answer):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]


class TopLogprob(_Response):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatLogprobToken(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatChoiceLogprobs(_Response):
    content: list[ChatLogprobToken] | None = None
    refusal: list[ChatLogprobToken] | None = None


class ChatMessageOut(_Response):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[dict[str, Any]] | None = None     # OpenAI's [{id, type: "function", function: {name, arguments}}]


class ChatChoice(_TokenIdsChoice):
    index: int
    message: ChatMessageOut
    logprobs: ChatChoiceLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(_Answer):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    prompt_logprobs: PromptLogprobs | None = None
