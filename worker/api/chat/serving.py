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

``create_chat_completion`` runs this API's checks (``worker.api.chat.protocol``), the messages and
tools (``worker.api.chat.prompt``) and the shared preparation (``worker.api.prepare``: request id,
constraints compiled once, engine parameters) before admission;
``worker.api.driver.serve`` runs the choices; ``ChatFormatter`` writes the chunks or the response.
"""

from __future__ import annotations

from fastapi import Request, Response

from worker import tools as tool_calls
from worker.api.chat.prompt import conversation, messages_bytes, prompt_ids, with_tools
from worker.api.chat.protocol import ChatCompletionRequest, validate_chat
from worker.api.choice_models import ChatChoice, ChatChoiceLogprobs, ChatCompletionResponse, ChatMessageOut
from worker.api.driver import ChoicesFormatter, seeded, serve
from worker.api.logprobs import chat_logprobs, prompt_logprobs_out
from worker.api.prepare import Preparation
from worker.choices import ChoiceEvent, ChoiceSpec
from worker.continuation import DRAIN_ABORT, response_headers
from worker.serving import ServingState


async def create_chat_completion(state: ServingState, req: ChatCompletionRequest, raw: Request) -> Response:
    state.check_model(req.model)
    constraint = validate_chat(req, state.config.max_logprobs, state.config.limits)
    state.check_chat_template(req)
    state.check_engine()
    state.check_prompt_logprobs(req)
    state.check_speculative(req)
    msgs = conversation(req)
    tool_calls.check_history(req)
    plan, msgs, tools = with_tools(state, msgs, req, req.tools, req.tool_choice, req.parallel_tool_calls)
    prep = Preparation(state, req, "chatcmpl", constraint, plan)
    state.check_prompt_bytes(messages_bytes(msgs), "messages", req.truncate_prompt_tokens is not None)
    await prep.compile()

    async def prepare():
        ids = await prompt_ids(state, msgs, req, tools, req.truncate_prompt_tokens, "messages")
        base = prep.params(len(ids))
        specs = [ChoiceSpec(i, f"{prep.request_id}-{i}", ids, seeded(base, i), req.skip_special_tokens,
                            continuation=prep.continuation_ids(), text_min_tokens=req.min_tokens,
                            report_ids=bool(req.return_token_ids))
                 for i in range(req.n)]
        return specs, ChatFormatter(state, req, prep.request_id, specs, plan)

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
