"""The Responses API's output: the Response object and its output items, as exact models.

``extra="forbid"`` (as ``worker.api.choice_models`` for chat and completions): a field the
Response carries is one declared here, so a typo in the formatter fails its test instead of
reaching a client. Field order is the wire order. The stream's events
(``worker.api.responses.serving``) carry these models (an item, a part, the Response).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OutputText(_Out):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class MessageItem(_Out):
    type: Literal["message"] = "message"
    id: str
    status: str
    role: Literal["assistant"] = "assistant"
    content: list[OutputText]


class FunctionCallItem(_Out):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: str = "completed"


OutputItem = Annotated[MessageItem | FunctionCallItem, Field(discriminator="type")]


class InputTokensDetails(_Out):
    cached_tokens: int = 0


class OutputTokensDetails(_Out):
    reasoning_tokens: int = 0


class ResponseUsage(_Out):
    input_tokens: int
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int


class ResponseError(_Out):
    code: str
    message: str


class IncompleteDetails(_Out):
    reason: Literal["max_output_tokens"] = "max_output_tokens"


class ResponseObject(_Out):
    """The Response; the request's settings echoed as OpenAI does (nothing stored, no reasoning)."""
    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    model: str
    output: list[OutputItem] = Field(default_factory=list)
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    text: dict[str, Any]
    tools: list[dict[str, Any]] = Field(default_factory=list)
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True
    previous_response_id: None = None
    store: Literal[False] = False
    truncation: Literal["disabled"] = "disabled"
    background: Literal[False] = False
    reasoning: None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    user: str | None = None
    service_tier: Literal["default"] = "default"
    usage: ResponseUsage | None = None
