"""``POST /v1/chat/completions``: messages -> chat template -> token ids -> n choices.

The prompt is the tokenizer's chat template rendered to text (``add_generation_prompt``,
``continue_final_message``, ``chat_template``, ``chat_template_kwargs`` as in vLLM)
and encoded without adding special tokens (the template has them). Text content
parts are joined with newlines; other part types are refused. Streaming follows
OpenAI: each choice's first chunk is ``delta: {role: "assistant", content: ""}``,
its last one carries ``finish_reason``; with ``include_usage`` a final chunk has
``choices: []`` and the usage; then ``[DONE]``. ``prompt_logprobs`` (vLLM's extension,
not with streaming) puts the rendered prompt's token logprobs at the response's top
level, in vLLM's shape.

Tools (``worker.tools``): with a tool plan, a choice's output becomes ``tool_calls`` (and
``finish_reason: "tool_calls"``) when it holds calls; an output cut by ``max_tokens`` keeps
the calls it completed under "required" and its ``finish_reason: "length"``. Streaming: "required" and named
outputs are held back and sent as ``tool_calls`` deltas when the choice ends (per call: a
delta with ``id``, ``type`` and ``function.name``, then one with ``function.arguments``);
"auto" streams content as usual once the output cannot be the start of a call, and
holds it back while it can.

``return_token_ids`` adds each choice's generated ids (``token_ids``); ``continuation_token_ids``
resumes a generation (worker.continuation: no role chunk, usage for the whole generation).
"""

from __future__ import annotations

import dataclasses
import json

from fastapi import Request, Response

from worker import tools as tool_calls
from worker.continuation import response_headers
from worker.errors import APIError, bad_request
from worker.logprobs import chat_logprobs, prompt_logprobs_out
from worker.protocol import (ChatChoice, ChatChoiceLogprobs, ChatCompletionRequest, ChatCompletionResponse,
                             ChatMessageOut, UsageInfo, child_seed, now, to_sampling_params, validate_request)
from worker.structured import structured_spec
from worker.serving import (SSE_DONE, ChoiceSpec, ChoiceStreams, ClientDisconnected, GuardedStreamingResponse,
                            ServingState, engine_error, monotonic, new_id, sse, until_disconnect, with_headers)

# Arguments of apply_chat_template that chat_template_kwargs must not override.
_RESERVED_KWARGS = {"conversation", "tokenize", "add_generation_prompt", "continue_final_message", "chat_template",
                    "return_dict", "return_tensors", "padding", "truncation", "max_length", "tokenizer_kwargs",
                    "return_assistant_tokens_mask"}


def conversation(req) -> list[dict]:
    msgs = []
    for i, m in enumerate(req.messages):
        d = m.model_dump(exclude_none=True)
        content = m.content
        if isinstance(content, list):
            texts = []
            for part in content:
                kind = part.get("type")
                if kind not in ("text", "input_text"):
                    raise bad_request(f"Content part type {kind!r} is not supported (text only).",
                                      f"messages.{i}.content")
                if not isinstance(part.get("text"), str):
                    raise bad_request("A text content part needs a string 'text'.", f"messages.{i}.content")
                texts.append(part["text"])
            content = "\n".join(texts)
        d["content"] = content or ""
        msgs.append(d)
    return msgs


def render_chat(tokenizer, msgs, req, tools: list | None = None) -> list[int]:
    """Runs in the executor. ``req``: the chat request (or /tokenize's, which has the same template fields).
    ``tools``: passed to a template that renders them (``worker.tools.prepare_messages``)."""
    kwargs = dict(req.chat_template_kwargs or {})
    if tools is not None:
        kwargs["tools"] = tools
    bad = _RESERVED_KWARGS & kwargs.keys()
    if bad:
        raise bad_request(f"chat_template_kwargs may not set {sorted(bad)}.", "chat_template_kwargs")
    try:
        text = tokenizer.apply_chat_template(
            msgs, tokenize=False, add_generation_prompt=req.add_generation_prompt,
            continue_final_message=req.continue_final_message, chat_template=req.chat_template, **kwargs)
    except APIError:
        raise
    except Exception as exc:  # noqa: BLE001 - template errors (jinja, missing template) are the client's input
        raise bad_request(f"Could not apply the chat template: {exc}", "messages") from exc
    return list(tokenizer.encode(text, add_special_tokens=req.add_special_tokens))


def check_chat(state: ServingState, req: ChatCompletionRequest) -> list[dict]:
    """The checks that need no tokenizer (before admission); returns the conversation."""
    validate_request(req, state.config.max_logprobs)
    state.check_chat_template(req)
    state.check_engine()
    state.check_prompt_logprobs(req)
    return conversation(req)


def template_text(state: ServingState, req) -> str | None:
    t = req.chat_template if req.chat_template is not None else getattr(state.tokenizer, "chat_template", None)
    return t if isinstance(t, str) else None


def check_tools(state: ServingState, req: ChatCompletionRequest, msgs: list[dict]):
    """The request's tool plan (400s before admission) -> (plan, messages, tools for the template)."""
    tool_calls.check_history(req)
    template = template_text(state, req)
    plan = tool_calls.plan(req, template)
    if plan is not None and plan.spec is not None and structured_spec(req) is not None:
        raise bad_request("tool_choice 'required' or a named function cannot be combined with a structured-output "
                          "constraint.", "tool_choice")
    msgs, tools = tool_calls.prepare_messages(msgs, plan, template)
    return plan, msgs, tools


async def chat_prompt(state: ServingState, req: ChatCompletionRequest, msgs: list[dict], tools=None, plan=None):
    """After admission: the template in the executor, truncation, and the one conversion to
    engine parameters. -> (prompt token ids, SamplingParams). A continuation (worker.continuation)
    counts in the engine's context but not in the returned prompt."""
    ids = await state.run_sync(render_chat, state.tokenizer, msgs, req, tools)
    if req.truncate_prompt_tokens is not None and len(ids) > req.truncate_prompt_tokens:
        ids = ids[-req.truncate_prompt_tokens:]
    if not ids:
        raise bad_request("The rendered prompt is empty.", "messages")
    cont = req.continuation_token_ids or []
    if any(t >= state.vocab_size for t in cont):
        raise bad_request(f"continuation_token_ids must be < the vocabulary size {state.vocab_size}.",
                          "continuation_token_ids")
    params = to_sampling_params(req, prompt_len=len(ids) + len(cont), max_model_len=state.engine.max_model_len,
                                vocab_size=state.vocab_size, done=len(cont))
    if plan is not None and plan.spec is not None:
        params = dataclasses.replace(params, structured=plan.spec)
    return ids, params


async def create_chat_completion(state: ServingState, req: ChatCompletionRequest, raw: Request) -> Response:
    state.check_model(req.model)
    msgs = check_chat(state, req)
    plan, msgs, tools = check_tools(state, req, msgs)
    arrival = monotonic()
    state.admit()
    handed_over = False
    try:
        ids, base = await chat_prompt(state, req, msgs, tools, plan)
        request_id = new_id("chatcmpl")
        specs = [ChoiceSpec(i, f"{request_id}-{i}", ids,
                            dataclasses.replace(base, seed=child_seed(base.seed, i)) if i else base,
                            req.skip_special_tokens, continuation=list(req.continuation_token_ids or []),
                            text_min_tokens=req.min_tokens, report_ids=bool(req.return_token_ids))
                 for i in range(req.n)]
        if req.stream:
            body = _stream(state, req, request_id, specs, len(ids), arrival, plan)
            handed_over = True
            return GuardedStreamingResponse(body, on_close=state.release, headers=response_headers(req))
        try:
            out = await until_disconnect(raw, _full(state, req, request_id, specs, len(ids), arrival, plan))
            return with_headers(out, response_headers(req))
        except ClientDisconnected:
            return Response(status_code=499)
    finally:
        if not handed_over:
            state.release()


async def _full(state, req, request_id, specs, prompt_tokens, arrival, plan=None) -> ChatCompletionResponse:
    k = req.logprobs_k()
    choices = {s.index: ChatChoice(index=s.index, message=ChatMessageOut(content=""),
                                   logprobs=ChatChoiceLogprobs(content=[]) if k is not None else None)
               for s in specs}
    out_tokens = {s.index: 0 for s in specs}
    prompt_lps = None
    events = ChoiceStreams(state, specs, arrival).events()
    try:
        async for ev in events:
            c = choices[ev.index]
            if ev.prompt_logprobs is not None and prompt_lps is None:     # the same for every choice
                prompt_lps = prompt_logprobs_out(state.token_texts, ev.prompt_logprobs, req.prompt_logprobs)
            c.message.content += ev.text
            if req.return_token_ids:
                c.token_ids = (c.token_ids or []) + ev.token_ids
            out_tokens[ev.index] = ev.num_output_tokens
            if k is not None and ev.logprobs:
                c.logprobs.content.extend(chat_logprobs(state.token_texts, ev.logprobs, k))
            if ev.finish_reason is not None:
                c.finish_reason, c.stop_reason = ev.finish_reason, ev.stop_reason
    except Exception as exc:  # noqa: BLE001 - mapped to an OpenAI error
        raise engine_error(exc) from exc
    finally:
        await events.aclose()
    if plan is not None:
        for c in choices.values():
            content, found = tool_calls.calls(plan, c.message.content or "", c.finish_reason)
            if found:
                c.message.content, c.message.tool_calls = content, tool_calls.call_objects(found)
                if c.finish_reason == "stop":           # "length" stays: the client learns the output was cut
                    c.finish_reason, c.stop_reason = "tool_calls", None
    n = sum(out_tokens.values())
    return ChatCompletionResponse(
        id=request_id, model=state.config.model_name, choices=[choices[i] for i in sorted(choices)],
        usage=UsageInfo(prompt_tokens=prompt_tokens, completion_tokens=n, total_tokens=prompt_tokens + n),
        prompt_logprobs=prompt_lps)


def _held_deltas(plan, text: str, finish: str):
    """A held-back output at its end -> [(delta, finish_reason)]: tool_calls deltas, or the text."""
    content, found = tool_calls.calls(plan, text, finish)
    if not found:
        return [({"content": text} if text else {}, finish)]
    out = [({"content": content}, None)] if content else []
    for i, c in enumerate(tool_calls.call_objects(found)):
        fn = c["function"]
        out.append(({"tool_calls": [{"index": i, "id": c["id"], "type": "function",
                                     "function": {"name": fn["name"], "arguments": ""}}]}, None))
        out.append(({"tool_calls": [{"index": i, "function": {"arguments": fn["arguments"]}}]}, None))
    out.append(({}, "tool_calls" if finish == "stop" else finish))
    return out


def _dumps(obj: dict) -> str:
    return sse(json.dumps(obj, ensure_ascii=False, separators=(",", ":")))


async def _stream(state, req, request_id, specs, prompt_tokens, arrival, plan=None):
    created, model, k = now(), state.config.model_name, req.logprobs_k()
    held = {s.index: "" for s in specs}                       # text held back while it may be a tool call
    free = {s.index: plan is None for s in specs}             # streams content as it comes
    include_usage, continuous = req.include_usage, req.continuous_usage
    out_tokens = {s.index: 0 for s in specs}

    def chunk(index: int, delta: dict, logprobs=None, finish=None, stop=None, token_ids=None) -> str:
        obj = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": model,
               "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish,
                            "stop_reason": stop}]}
        if req.return_token_ids:
            obj["choices"][0]["token_ids"] = token_ids or []
        if continuous:
            n = out_tokens[index]
            obj["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}
        elif include_usage:
            obj["usage"] = None
        return _dumps(obj)

    streams = ChoiceStreams(state, specs, arrival)
    events = streams.events()
    try:
        for s in specs:
            if not s.continuation:          # a resumed stream: the client has its role chunk already
                yield chunk(s.index, {"role": "assistant", "content": ""})
        async for ev in events:
            out_tokens[ev.index] = ev.num_output_tokens
            lp = None
            if k is not None and ev.logprobs:
                lp = {"content": [e.model_dump() for e in chat_logprobs(state.token_texts, ev.logprobs, k)],
                      "refusal": None}
            text = ev.text
            if not free[ev.index]:
                held[ev.index] += text
                text = ""
                if plan.mode == "auto" and not plan.fmt.may_start_call(held[ev.index]):
                    free[ev.index], text, held[ev.index] = True, held[ev.index], ""
            if ev.finish_reason is not None and not free[ev.index]:
                for delta, finish in _held_deltas(plan, held[ev.index], ev.finish_reason):
                    yield chunk(ev.index, delta, None, finish, ev.stop_reason if finish == ev.finish_reason else None)
                continue
            delta = {"content": text} if text else {}
            yield chunk(ev.index, delta, lp, ev.finish_reason, ev.stop_reason, ev.token_ids)
        if include_usage:
            n = sum(out_tokens.values())
            yield _dumps({"id": request_id, "object": "chat.completion.chunk", "created": created, "model": model,
                          "choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n,
                                                   "total_tokens": prompt_tokens + n}})
        yield SSE_DONE
    except Exception as exc:  # noqa: BLE001 - the status line is gone: report in-band, as vLLM does
        err = exc if isinstance(exc, APIError) else engine_error(exc)
        yield _dumps(err.body())
        yield SSE_DONE
    finally:
        streams.cancel()
        await events.aclose()
