"""``POST /tokenize`` and ``POST /detokenize`` with vLLM's request and response shapes.

/tokenize takes either ``prompt`` (text; ``add_special_tokens`` default true) or chat
``messages`` (rendered with the model's chat template exactly as
/v1/chat/completions renders them: ``add_generation_prompt`` default true,
``continue_final_message``, ``chat_template``, ``chat_template_kwargs``;
``add_special_tokens`` default false) and answers ``{count, max_model_len, tokens,
token_strs}``; ``token_strs`` (the tokenizer's own pieces, as vLLM) only with
``return_token_strs``. /detokenize takes ``tokens`` and answers ``{prompt}`` (special
tokens kept). ``model`` is optional, as in vLLM; when given it must be served here.
Tokenisation runs in the serving state's tokenizer thread, never on the event loop. The requests
are ``worker.api.tokenize.protocol``; messages render through ``worker.api.chat.prompt``.
"""

from __future__ import annotations

from worker import tools as tool_calls
from worker.api.chat.prompt import conversation, messages_bytes, render_chat, with_tools
from worker.api.chat.protocol import check_template_flags
from worker.api.tokenize.protocol import DetokenizeRequest, TokenizeRequest
from worker.errors import bad_request
from worker.serving import ServingState


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
        check_template_flags(req)
        # The prompt chat completions would render: tools and tool-call history as there (tool_choice "auto").
        tool_calls.check_history(req)
        _, msgs, tools = with_tools(state, conversation(req), req, req.tools)
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
