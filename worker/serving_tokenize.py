"""``POST /tokenize`` and ``POST /detokenize`` with vLLM's request and response shapes.

/tokenize takes either ``prompt`` (text; ``add_special_tokens`` default true) or chat
``messages`` (rendered with the model's chat template exactly as
/v1/chat/completions renders them: ``add_generation_prompt`` default true,
``continue_final_message``, ``chat_template``, ``chat_template_kwargs``;
``add_special_tokens`` default false) and answers ``{count, max_model_len, tokens,
token_strs}``; ``token_strs`` (the tokenizer's own pieces, as vLLM) only with
``return_token_strs``. /detokenize takes ``tokens`` and answers ``{prompt}`` (special
tokens kept). ``model`` is optional, as in vLLM; when given it must be served here.
Tokenisation runs in the serving state's tokenizer thread, never on the event loop.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, StrictInt, model_validator

from worker.errors import bad_request
from worker.protocol import ChatMessage, _Request
from worker.serving import ServingState
from worker import tools as tool_calls
from worker.serving_chat import conversation, messages_bytes, render_chat, template_text


class TokenizeRequest(_Request):
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


class DetokenizeRequest(_Request):
    model: str | None = None
    tokens: list[StrictInt]             # ids, not "1" or true


def _tokenize(tok, req: TokenizeRequest, msgs, tools) -> list[int]:
    """Runs in a tokenizer thread (``ServingState.run_tokenizer``)."""
    if req.prompt is not None:
        return list(tok.encode(req.prompt, add_special_tokens=req.add_special_tokens is not False))
    req.add_special_tokens = bool(req.add_special_tokens)
    return render_chat(tok, msgs, req, tools)


async def tokenize(state: ServingState, req: TokenizeRequest) -> dict:
    state.check_model(req.model)
    msgs = tools = None
    if req.messages is not None:
        state.check_chat_template(req)
        if req.add_generation_prompt and req.continue_final_message:
            raise bad_request("add_generation_prompt and continue_final_message cannot both be true.",
                              "continue_final_message")
        # The prompt chat completions would render: tools and tool-call history as there (tool_choice "auto").
        tool_calls.check_history(req)
        template = template_text(state, req)
        plan = tool_calls.plan(req, template, state.config.limits)
        msgs, tools = tool_calls.prepare_messages(conversation(req), plan, template)
    elif req.tools:
        raise bad_request("tools need messages.", "tools")
    nbytes = len(req.prompt.encode("utf-8")) if req.prompt is not None else messages_bytes(msgs)
    ids = await state.run_tokenizer(nbytes, _tokenize, req, msgs, tools)
    strs = await state.run_sync(state.tokenizer.convert_ids_to_tokens, ids) if req.return_token_strs else None
    return {"count": len(ids), "max_model_len": state.engine.max_model_len, "tokens": ids, "token_strs": strs}


async def detokenize(state: ServingState, req: DetokenizeRequest) -> dict:
    state.check_model(req.model)
    if any(not 0 <= t < state.tokenizer_size for t in req.tokens):
        raise bad_request(f"tokens must be token ids in [0, {state.tokenizer_size}).", "tokens")
    text = await state.run_sync(state.tokenizer.decode, req.tokens, skip_special_tokens=False,
                                clean_up_tokenization_spaces=False)
    return {"prompt": text}
