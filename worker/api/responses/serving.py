"""``POST /v1/responses``: the Responses API, without server-side state.

Flow: this API's checks under its own field names (``worker.api.responses.protocol``), its
input items and tools (``worker.api.responses.items``) -> the tool plan and the chat template's
messages (``worker.api.chat.prompt``) -> the shared preparation (``worker.api.prepare``: request
id, constraints compiled once) -> admission -> the chat template in the executor -> the engine
parameters once -> one engine request, run by ``worker.api.driver.serve`` with
``ResponsesFormatter`` writing the events or the Response object (``ResponseView`` builds it
and its output items as the typed models of ``worker.api.responses.models``). The answer is
one assistant ``message`` output item holding one ``output_text`` part, or, with tools, the
calls the output holds (``worker.tools.calls``) as ``function_call`` items (after a
``message`` item for any text before them); ``usage`` counts input and output tokens.
``finish_reason == "length"`` makes the response ``incomplete`` with
``incomplete_details.reason = "max_output_tokens"``.

Streaming sends OpenAI's event sequence as ``event: <type>`` + ``data: <json>`` SSE
events, each with a ``sequence_number``: ``response.created``, ``response.in_progress``,
``response.output_item.added``, ``response.content_part.added``,
``response.output_text.delta`` per text piece, ``response.output_text.done``,
``response.content_part.done``, ``response.output_item.done``, then
``response.completed`` (or ``response.incomplete``). With tools, text is held back while
it may be a call (as on the chat path); each call is sent at the end as
``response.output_item.added`` (arguments empty), ``response.function_call_arguments.delta``,
``response.function_call_arguments.done`` and ``response.output_item.done``. An engine failure after the first
byte ends the stream with ``response.failed`` carrying the error. No ``[DONE]``
follows, as in OpenAI's API: the terminal event ends the stream.

Migration (worker.continuation, streams only): ``return_token_ids`` puts a delta's ids on it
(``token_ids``) and sends other ids as ``swiftserve.token_ids`` events (no
``sequence_number``; the generation's last ones, with ``finish_reason``, before its last
text); ``continuation_token_ids`` resumes: no opening events, the continuation's text
replayed into the state (held or free) unsent. A drain abort ends the stream with
``response.failed`` (code ``shutting_down``), which a gateway migrates.
"""

from __future__ import annotations

import json

from fastapi import Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from worker import tools as tool_calls
from worker.api.chat.prompt import TemplateOptions, messages_bytes, prompt_ids, with_tools
from worker.api.choice_models import now
from worker.api.driver import serve
from worker.api.prepare import Preparation
from worker.api.responses import items as input_items
from worker.api.responses.models import (FunctionCallItem, IncompleteDetails, MessageItem, OutputText,
                                         ResponseError, ResponseObject, ResponseUsage)
from worker.api.responses.protocol import ResponsesRequest, check_generation, echo_format, validate
from worker.choices import ChoiceSpec
from worker.continuation import DRAIN_ABORT, response_headers
from worker.errors import APIError
from worker.serving import ServingState, new_id

TEMPLATE = TemplateOptions()        # the Responses API has no template fields: vLLM's defaults


class ResponseView:
    """Builds the Response object and its output items for one request."""

    def __init__(self, req: ResponsesRequest, model: str, input_tokens: int, plan=None, id: str | None = None) -> None:
        self.req, self.model, self.input_tokens, self.plan = req, model, input_tokens, plan
        self.id, self.msg_id = id or new_id("resp"), new_id("msg")
        self.created = now()

    @staticmethod
    def part(text: str) -> OutputText:
        return OutputText(text=text)

    def message(self, status: str, text: str | None) -> MessageItem:
        return MessageItem(id=self.msg_id, status=status, content=[] if text is None else [self.part(text)])

    @staticmethod
    def function_call(name: str, arguments: str, status: str = "completed") -> FunctionCallItem:
        call_id = tool_calls.call_objects([(name, arguments)])[0]["id"]
        return FunctionCallItem(id=new_id("fc"), call_id=call_id, name=name, arguments=arguments, status=status)

    def split(self, text: str, finish: str | None) -> tuple[str | None, list]:
        """(text for a message item or None, [(name, arguments)]) of a finished output."""
        if self.plan is None:
            return text, []
        content, found = tool_calls.calls(self.plan, text, finish)
        return (content if content else None) if found else text, found

    def items(self, status: str, text: str, finish: str | None) -> list[MessageItem | FunctionCallItem]:
        content, found = self.split(text, finish)
        out = [self.message(status, content)] if content is not None else []
        return out + [self.function_call(n, a) for n, a in found]

    def response(self, status: str, output: list | None = None, output_tokens: int = 0, finish: str | None = None,
                 error: ResponseError | None = None) -> ResponseObject:
        r = self.req
        done = status in ("completed", "incomplete")
        return ResponseObject(
            id=self.id, created_at=self.created, status=status, model=self.model, output=output or [], error=error,
            incomplete_details=IncompleteDetails() if finish == "length" else None,
            instructions=r.instructions, max_output_tokens=r.max_output_tokens,
            temperature=1.0 if r.temperature is None else r.temperature,
            top_p=1.0 if r.top_p is None else r.top_p,
            text=echo_format(r), tools=r.tools or [], tool_choice=r.tool_choice or "auto",
            parallel_tool_calls=True if r.parallel_tool_calls is None else r.parallel_tool_calls,
            metadata=r.metadata or {}, user=r.user, usage=self.usage(output_tokens) if done else None)

    def usage(self, output_tokens: int) -> ResponseUsage:
        return ResponseUsage(input_tokens=self.input_tokens, output_tokens=output_tokens,
                             total_tokens=self.input_tokens + output_tokens)


def _status(finish: str | None) -> str:
    return "incomplete" if finish == "length" else "completed"


async def create_response(state: ServingState, req: ResponsesRequest, raw: Request) -> Response:
    state.check_model(req.model)
    validate(req)
    msgs = input_items.messages(req)
    constraint = check_generation(req, state.config.limits)
    state.check_engine()
    plan, msgs, tools = with_tools(state, msgs, TEMPLATE, req.tools, input_items.tool_choice(req),
                                   req.parallel_tool_calls, input_items.function_of)
    prep = Preparation(state, req, "resp", constraint, plan)
    state.check_prompt_bytes(messages_bytes(msgs), "input")
    await prep.compile()

    async def prepare():
        ids = await prompt_ids(state, msgs, TEMPLATE, tools, None, "input")
        params = prep.params(len(ids))
        view = ResponseView(req, state.config.model_name, len(ids), plan, prep.request_id)
        cont = prep.continuation_ids()
        spec = ChoiceSpec(0, view.id, ids, params, continuation=cont, report_ids=bool(req.return_token_ids))
        return [spec], ResponsesFormatter(view, bool(cont), spec.report_ids)

    return await serve(state, raw, req.stream, prepare, response_headers(req))


class ResponsesFormatter:
    """The Responses API's wire format for the driver (``worker.api.driver.Formatter``):
    the event sequence of the module docstring, or one Response object.

    ``text`` is the whole output so far, ``n`` its token count, ``finish`` the finish reason
    once known. Streaming: ``free`` is True once text streams as it comes (no tool plan, or
    an "auto" output that cannot be a call); until then the text is held back."""

    def __init__(self, view: ResponseView, resumed: bool = False, report_ids: bool = False) -> None:
        self.view, self.plan, self.resumed, self.report_ids = view, view.plan, resumed, report_ids
        self.text, self.n, self.finish = "", 0, None
        self.drained = False
        self.free = self.plan is None
        self.seq = 0
        self.where = {"item_id": view.msg_id, "output_index": 0, "content_index": 0}

    def _take(self, ev) -> None:
        self.n = ev.num_output_tokens
        self.finish = ev.finish_reason or self.finish
        self.text += ev.text

    # ---- the whole answer ---------------------------------------------------------------------
    def add(self, ev) -> None:
        self._take(ev)

    def result(self) -> JSONResponse:
        status = _status(self.finish)
        return JSONResponse(self.view.response(status, self.view.items(status, self.text, self.finish), self.n,
                                               self.finish).model_dump(mode="json"))

    # ---- streaming ----------------------------------------------------------------------------
    def event(self, kind: str, **fields) -> str:
        fields = {k: v.model_dump(mode="json") if isinstance(v, BaseModel) else v for k, v in fields.items()}
        payload = json.dumps({"type": kind, "sequence_number": self.seq, **fields}, ensure_ascii=False,
                             separators=(",", ":"))
        self.seq += 1
        return f"event: {kind}\ndata: {payload}\n\n"

    def _opened(self):
        yield self.event("response.output_item.added", output_index=0, item=self.view.message("in_progress", None))
        yield self.event("response.content_part.added", part=self.view.part(""), **self.where)

    def _closed(self, status: str, text: str):
        yield self.event("response.output_text.done", text=text, logprobs=[], **self.where)
        yield self.event("response.content_part.done", part=self.view.part(text), **self.where)
        yield self.event("response.output_item.done", output_index=0, item=self.view.message(status, text))

    def _delta(self, text: str, ids: list[int] | None = None) -> str:
        extra = {"token_ids": ids} if ids is not None else {}
        return self.event("response.output_text.delta", delta=text, logprobs=[], **self.where, **extra)

    def _ids(self, ev) -> str:
        """A SwiftServe event with the generated ids (``return_token_ids``; no ``sequence_number``): the
        last one of a generation that ended says so (``finish_reason``)."""
        obj = {"type": "swiftserve.token_ids", "token_ids": ev.token_ids}
        if ev.finish_reason is not None and not self.drained:
            obj["finish_reason"] = ev.finish_reason
        return f"event: swiftserve.token_ids\ndata: {json.dumps(obj, separators=(',', ':'))}\n\n"

    def opening(self):
        if self.resumed:            # a continuation: the client has these, and maybe the message item
            return
        yield self.event("response.created", response=self.view.response("in_progress"))
        yield self.event("response.in_progress", response=self.view.response("in_progress"))
        if self.free:
            yield from self._opened()

    def stream_event(self, ev):
        self._take(ev)
        if ev.replayed:                       # a continuation's text: state only (worker.continuation)
            self.free = self.free or (self.plan.mode == "auto" and not self.plan.fmt.may_start_call(self.text))
            return
        self.drained = ev.finish_reason == "abort" and ev.stop_reason == DRAIN_ABORT
        # ids go on the delta that sends their text; alone otherwise, and first for the last event (whose
        # finish_reason tells a gateway that only the closing burst is left)
        last = self.report_ids and ev.finish_reason is not None and not self.drained
        inline = ev.token_ids if self.report_ids and not last else None
        if last:
            yield self._ids(ev)
        text = None
        if not self.free and self.plan.mode == "auto" and not self.plan.fmt.may_start_call(self.text):
            self.free = True                  # prose: what was held goes out as the first delta
            yield from self._opened()
            text = self.text
        elif self.free:
            text = ev.text
        if text:
            yield self._delta(text, inline)
        elif inline:
            yield self._ids(ev)

    def closing(self):
        status, view = _status(self.finish), self.view
        if self.drained:            # resumable elsewhere (worker.continuation): a gateway moves the stream
            yield self.event("response.failed", response=view.response("failed", error=ResponseError(
                code="shutting_down", message="The worker shut down before the response was complete.")))
            return
        if self.free:
            yield from self._closed(status, self.text)
            output = [view.message(status, self.text)]
        else:
            output = view.items(status, self.text, self.finish)
            for i, item in enumerate(output):
                if isinstance(item, MessageItem):
                    yield from self._opened()
                    yield self._delta(item.content[0].text)
                    yield from self._closed(status, item.content[0].text)
                    continue
                yield self.event("response.output_item.added", output_index=i,
                                 item=item.model_copy(update={"arguments": "", "status": "in_progress"}))
                at = {"item_id": item.id, "output_index": i}
                yield self.event("response.function_call_arguments.delta", delta=item.arguments, **at)
                yield self.event("response.function_call_arguments.done", arguments=item.arguments, **at)
                yield self.event("response.output_item.done", output_index=i, item=item)
        yield self.event(f"response.{status}", response=view.response(status, output, self.n, self.finish))

    def failed(self, err: APIError):
        """The status line is gone: the failure is the last event (no ``[DONE]``)."""
        yield self.event("response.failed", response=self.view.response(
            "failed", error=ResponseError(code=str(err.code or err.type), message=err.message)))
