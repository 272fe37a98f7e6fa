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
resumes a generation (worker.continuation: no role chunk, usage for the whole generation; the
continuation's text is replayed through the tool-call holding, unreported). A choice's held
tool-call deltas go out in one write, the last of them carrying its finish and its last ids;
a drain abort sends none of the held text (the resuming worker holds it again).

``create_chat_completion`` does the checks and builds the choices; ``worker.serving_driver.serve``
runs them; ``ChatFormatter`` writes the chunks or the response. The template and tool helpers
(``check_chat``, ``check_tools``, ``check_costs``, ``chat_prompt``) serve ``/v1/responses`` and
``/tokenize`` too. ``check_costs`` is the last step before admission: the messages' byte length
(``ServingState.check_prompt_bytes``) and the compile of every constraint (structured output,
tools' schemas) off the event loop.
"""

from __future__ import annotations

import dataclasses

from fastapi import Request, Response

from worker import tools as tool_calls
from worker.continuation import DRAIN_ABORT, check_constrained, response_headers
from worker.errors import APIError, bad_request
from worker.logprobs import chat_logprobs, prompt_logprobs_out
from worker.protocol import ChatCompletionRequest, to_sampling_params, validate_request
from worker.response_models import ChatChoice, ChatChoiceLogprobs, ChatCompletionResponse, ChatMessageOut
from worker.structured import request_constraint, structured_spec
from worker.serving import ChoiceEvent, ChoiceSpec, ServingState, new_id
from worker.serving_driver import ChoicesFormatter, seeded, serve

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
    validate_request(req, state.config.max_logprobs, state.config.limits)
    state.check_chat_template(req)
    state.check_engine()
    state.check_prompt_logprobs(req)
    state.check_speculative(req)
    return conversation(req)


def template_text(state: ServingState, req) -> str | None:
    t = req.chat_template if req.chat_template is not None else getattr(state.tokenizer, "chat_template", None)
    return t if isinstance(t, str) else None


def check_tools(state: ServingState, req: ChatCompletionRequest, msgs: list[dict]):
    """The request's tool plan (400s before admission, a constrained continuation this engine cannot resume
    among them) -> (plan, messages, tools for the template)."""
    tool_calls.check_history(req)
    template = template_text(state, req)
    plan = tool_calls.plan(req, template, state.config.limits)
    if plan is not None and plan.spec is not None and structured_spec(req) is not None:
        raise bad_request("tool_choice 'required' or a named function cannot be combined with a structured-output "
                          "constraint.", "tool_choice")
    constrained = (plan is not None and plan.spec is not None) or structured_spec(req) is not None
    check_constrained(state.engine, req, constrained)
    msgs, tools = tool_calls.prepare_messages(msgs, plan, template)
    return plan, msgs, tools


def messages_bytes(msgs: list[dict]) -> int:
    """UTF-8 bytes of the messages' text (what the template renders at least)."""
    return sum(len(m["content"].encode("utf-8")) for m in msgs if isinstance(m.get("content"), str))


async def check_costs(state: ServingState, req: ChatCompletionRequest, msgs: list[dict], plan) -> None:
    """Before admission: the prompt's bytes, then every constraint compiled (worker.constraints)."""
    state.check_prompt_bytes(messages_bytes(msgs), "messages", req.truncate_prompt_tokens is not None)
    found = request_constraint(req)
    await state.check_constraints(([found] if found else []) + (plan.checks if plan is not None else []))


async def chat_prompt(state: ServingState, req: ChatCompletionRequest, msgs: list[dict], tools=None, plan=None):
    """After admission: the template in the executor, truncation, and the one conversion to
    engine parameters. -> (prompt token ids, SamplingParams). A continuation (worker.continuation)
    counts in the engine's context but not in the returned prompt."""
    ids = await state.run_tokenizer(messages_bytes(msgs), render_chat, msgs, req, tools)
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
    await check_costs(state, req, msgs, plan)

    async def prepare():
        ids, base = await chat_prompt(state, req, msgs, tools, plan)
        request_id = new_id("chatcmpl")
        specs = [ChoiceSpec(i, f"{request_id}-{i}", ids, seeded(base, i), req.skip_special_tokens,
                            continuation=list(req.continuation_token_ids or []),
                            text_min_tokens=req.min_tokens, report_ids=bool(req.return_token_ids))
                 for i in range(req.n)]
        return specs, ChatFormatter(state, req, request_id, specs, plan)

    return await serve(state, raw, req.stream, prepare, response_headers(req))


class ChatFormatter(ChoicesFormatter):
    """Chat's wire format: ``chat.completion.chunk`` deltas, or one ``ChatCompletionResponse``.

    With a tool plan, a choice's text is held back while it may be a call (``held``) and
    turned into ``tool_calls`` at its end; ``free`` marks the choices that stream content
    as it comes. The prompt logprobs are the same for every choice: the first one kept."""

    object_name = "chat.completion.chunk"
    content_key = "delta"

    def __init__(self, state: ServingState, req: ChatCompletionRequest, request_id: str, specs: list[ChoiceSpec],
                 plan=None) -> None:
        super().__init__(state, req, request_id, specs, len(specs[0].prompt_token_ids))
        self.plan, self.k = plan, req.logprobs_k()
        self.held = {s.index: "" for s in specs}
        self.free = {s.index: plan is None for s in specs}
        self.resumed = {s.index: bool(s.continuation) for s in specs}
        self.choices = {s.index: ChatChoice(index=s.index, message=ChatMessageOut(content=""),
                                            logprobs=ChatChoiceLogprobs(content=[]) if self.k is not None else None)
                        for s in specs}
        self.prompt_lps = None

    # ---- streaming ----------------------------------------------------------------------------
    def opening(self):
        for index, resumed in self.resumed.items():
            if not resumed:          # a resumed stream: the client has its role chunk already
                yield self.chunk(index, {"role": "assistant", "content": ""})

    def _hold(self, i: int, text: str) -> str:
        """Choice ``i``'s text through the tool-call holding -> what may be sent now as content.
        Once the held text cannot start a call it is released for good (the test is monotone), so
        replaying a continuation's text at once reaches the state the first worker reached in steps."""
        if self.free[i]:
            return text
        self.held[i] += text
        if self.plan.mode == "auto" and not self.plan.fmt.may_start_call(self.held[i]):
            self.free[i], text, self.held[i] = True, self.held[i], ""
            return text
        return ""

    def replay(self, ev: ChoiceEvent) -> None:
        self._hold(ev.index, ev.text)          # what the first worker released, the client has

    def event_chunks(self, ev: ChoiceEvent):
        lp = None
        if self.k is not None and ev.logprobs:
            lp = {"content": [e.model_dump() for e in chat_logprobs(self.state.token_texts, ev.logprobs, self.k)],
                  "refusal": None}
        i = ev.index
        text = self._hold(i, ev.text)
        if ev.finish_reason is not None and not self.free[i]:
            if ev.finish_reason == "abort" and ev.stop_reason == DRAIN_ABORT:
                # the worker that resumes it holds the same text again: none of it goes out here
                yield self.chunk(i, {}, None, ev.finish_reason, ev.stop_reason, ev.token_ids)
                return
            deltas = _held_deltas(self.plan, self.held[i], ev.finish_reason)
            # One write: a choice's calls reach the client together (worker.continuation); its last ids
            # go with its finish.
            yield "".join(self.chunk(i, delta, None, finish, ev.stop_reason if finish == ev.finish_reason else None,
                                     ev.token_ids if k == len(deltas) - 1 else None)
                          for k, (delta, finish) in enumerate(deltas))
            return
        yield self.chunk(i, {"content": text} if text else {}, lp, ev.finish_reason, ev.stop_reason, ev.token_ids)

    # ---- the whole answer ---------------------------------------------------------------------
    def fold(self, ev: ChoiceEvent) -> None:
        c = self.choices[ev.index]
        if ev.prompt_logprobs is not None and self.prompt_lps is None:     # the same for every choice
            self.prompt_lps = prompt_logprobs_out(self.state.token_texts, ev.prompt_logprobs, self.req.prompt_logprobs)
        c.message.content += ev.text
        if self.req.return_token_ids:
            c.token_ids = (c.token_ids or []) + ev.token_ids
        if self.k is not None and ev.logprobs:
            c.logprobs.content.extend(chat_logprobs(self.state.token_texts, ev.logprobs, self.k))
        if ev.finish_reason is not None:
            c.finish_reason, c.stop_reason = ev.finish_reason, ev.stop_reason

    def result(self) -> ChatCompletionResponse:
        if self.plan is not None:
            for c in self.choices.values():
                content, found = tool_calls.calls(self.plan, c.message.content or "", c.finish_reason)
                if found:
                    c.message.content, c.message.tool_calls = content, tool_calls.call_objects(found)
                    if c.finish_reason == "stop":       # "length" stays: the client learns the output was cut
                        c.finish_reason, c.stop_reason = "tool_calls", None
        return ChatCompletionResponse(id=self.request_id, model=self.model,
                                      choices=[self.choices[i] for i in sorted(self.choices)],
                                      usage=self.usage(), prompt_logprobs=self.prompt_lps)


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
