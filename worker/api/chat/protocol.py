"""The /v1/chat/completions request: its messages, template and tool fields, and its checks.

Beyond the shared fields of ``worker.api.sampling``: ``messages`` (extra keys such as ``name``,
``tool_calls``, ``tool_call_id`` pass to the chat template), vLLM's template fields
(``add_generation_prompt``, ``continue_final_message``, ``chat_template``,
``chat_template_kwargs``), tools (``worker.tools``), and logprobs as chat asks for them
(``logprobs`` + ``top_logprobs``). The output limit is ``max_completion_tokens`` before
``max_tokens`` (``swiftcommon.token_limits``); unset, the rest of the context. The output models
are ``worker.api.choice_models``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from swiftcommon.token_limits import requested_limit
from worker.api.sampling import Constraint, SamplingRequest, validate_sampling
from worker.errors import bad_request
from worker.limits import RequestLimits


class ChatMessage(BaseModel):
    # Extra keys (name, tool_calls, tool_call_id, ...) are passed to the chat template.
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(SamplingRequest):
    _chat: ClassVar[bool] = True
    prompt_param: ClassVar[str] = "messages"
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)               # deprecated by OpenAI, still sent
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0)    # upper bound: WorkerConfig.max_logprobs
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_special_tokens: bool = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None                  # meaningless without tools: accepted
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None

    def requested_max_tokens(self) -> int | None:
        # The one rule (swiftcommon.token_limits): max_completion_tokens wins over max_tokens.
        return requested_limit("chat", {"max_completion_tokens": self.max_completion_tokens,
                                        "max_tokens": self.max_tokens})

    def logprobs_k(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def engine_prompt_logprobs(self) -> int | None:
        return self.prompt_logprobs


def validate_chat(req: ChatCompletionRequest, max_logprobs: int = 20,
                  limits: RequestLimits | None = None) -> Constraint | None:
    """The shared checks (``validate_sampling``), then this API's; returns the output constraint."""
    constraint = validate_sampling(req, max_logprobs, limits)
    if req.top_logprobs and not req.logprobs:
        raise bad_request("top_logprobs requires logprobs to be true.", "top_logprobs")
    if req.top_logprobs is not None and req.top_logprobs > max_logprobs:
        raise bad_request(f"top_logprobs must be <= {max_logprobs}.", "top_logprobs")
    if req.functions or req.function_call not in (None, "none", "auto"):
        raise bad_request("functions (function calling) are not supported.", "functions")
    check_template_flags(req)
    if req.continue_final_message and req.messages[-1].role != "assistant":
        raise bad_request("continue_final_message needs the last message to be from the assistant.",
                          "continue_final_message")
    return constraint


def check_template_flags(req) -> None:
    """``add_generation_prompt`` and ``continue_final_message`` exclude each other (chat and /tokenize)."""
    if req.add_generation_prompt and req.continue_final_message:
        raise bad_request("add_generation_prompt and continue_final_message cannot both be true.",
                          "continue_final_message")
