"""``POST /v1/completions``: prompts (text, batch of texts, token ids, batch of token
ids) -> n choices each, streamed as SSE or returned whole.

Scoring: ``echo`` puts the prompt text before the completion; with ``logprobs`` the
prompt tokens' logprobs (from the engine's prefill pass, first entry ``null``) come
before the generated ones in the same block, and ``text_offset`` counts from the
start of the echoed text. ``max_tokens: 0`` with ``echo`` returns the prompt only
(``completion_tokens`` 0, ``finish_reason`` "length"). ``prompt_logprobs`` (vLLM's
field, not with streaming) adds vLLM's per-token dicts to each choice. A stream
sends a choice's echoed prompt first: at once without logprobs, else with its
logprobs once the engine has computed them.

Choice ``index`` is ``prompt_index * n + i`` (as vLLM). ``usage.prompt_tokens``
counts each prompt once, ``completion_tokens`` every generated token of every
choice (including the EOS / stop token, as vLLM). ``return_token_ids`` adds each choice's generated
ids (``token_ids``); ``continuation_token_ids`` resumes a generation (worker.continuation). Flow: cheap checks ->
admission slot -> tokenise in the executor -> engine parameters per prompt ->
one engine request per choice. ``create_completion`` runs this API's checks
(``worker.api.completions.protocol``) and the shared preparation (``worker.api.prepare``: request
id, constraint compiled once, engine parameters per prompt) and builds the choices;
``worker.api.driver.serve`` runs them; ``CompletionFormatter`` writes the chunks or the response.
"""

from __future__ import annotations

from fastapi import Request, Response

from worker.api.choice_models import CompletionChoice, CompletionLogprobs, CompletionResponse
from worker.api.completions.protocol import CompletionRequest, validate_completion
from worker.api.driver import ChoicesFormatter, seeded, serve
from worker.api.logprobs import completion_logprobs, echo_logprobs, extend_logprobs, prompt_logprobs_out
from worker.api.prepare import Preparation
from worker.choices import ChoiceEvent, ChoiceSpec
from worker.continuation import response_headers
from worker.errors import bad_request
from worker.serving import ServingState


def _tokenize(tokenizer, prompt, add_special_tokens: bool, truncate: int | None, echo: bool, vocab_size: int):
    """Runs in the executor. Returns [(token_ids, echo_text | None)] per prompt.

    Token-id prompts are range-checked before anything decodes them (``echo``)."""
    if isinstance(prompt, str):
        items = [prompt]
    elif all(isinstance(p, str) for p in prompt):
        items = list(prompt)
    elif all(isinstance(p, int) for p in prompt):
        items = [list(prompt)]
    else:
        items = [list(p) for p in prompt]
    out = []
    for item in items:
        if isinstance(item, str):
            ids = tokenizer.encode(item, add_special_tokens=add_special_tokens)
            text = item
        else:
            ids, text = item, None
            if any(t >= vocab_size for t in ids):
                raise bad_request(f"Prompt token ids must be < the vocabulary size {vocab_size}.", "prompt")
        if truncate is not None and len(ids) > truncate:
            ids, text = ids[-truncate:], None
        if echo and text is None:
            text = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        out.append((list(ids), text if echo else None))
    return out


async def create_completion(state: ServingState, req: CompletionRequest, raw: Request) -> Response:
    state.check_model(req.model)
    constraint = validate_completion(req, state.config.max_logprobs, state.config.limits)
    prompt = req.prompt
    n_prompts = len(prompt) if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) else 1
    limit = state.config.max_choices_per_request
    if n_prompts * req.n > limit:
        raise bad_request(f"{n_prompts} prompts x n={req.n} = {n_prompts * req.n} choices exceed this worker's "
                          f"limit of {limit} per request.", "n")
    state.check_engine()
    state.check_prompt_logprobs(req)
    state.check_speculative(req)
    prep = Preparation(state, req, "cmpl", constraint)
    texts = [prompt] if isinstance(prompt, str) else [p for p in prompt if isinstance(p, str)]
    sizes = [len(t.encode("utf-8")) for t in texts]
    if sizes:
        state.check_prompt_bytes(max(sizes), "prompt", req.truncate_prompt_tokens is not None)
    await prep.compile()

    async def prepare():
        prompts = await state.run_tokenizer(sum(sizes), _tokenize, req.prompt, req.add_special_tokens,
                                            req.truncate_prompt_tokens, bool(req.echo), state.vocab_size)
        specs: list[ChoiceSpec] = []
        cont = prep.continuation_ids()
        for p_idx, (ids, _) in enumerate(prompts):
            if not ids:
                raise bad_request("The prompt is empty after tokenisation.", "prompt")
            if any(t >= state.vocab_size for t in ids):
                raise bad_request(f"Prompt token ids must be < the vocabulary size {state.vocab_size}.", "prompt")
            base = prep.params(len(ids))
            for i in range(req.n):
                index = p_idx * req.n + i
                specs.append(ChoiceSpec(index, f"{prep.request_id}-{index}", ids, seeded(base, i),
                                        req.skip_special_tokens, req.score_only, cont, req.min_tokens,
                                        bool(req.return_token_ids)))
        echo = {s.index: prompts[s.index // req.n][1] for s in specs} if req.echo else {}
        prompt_tokens = sum(len(ids) for ids, _ in prompts)
        return specs, CompletionFormatter(state, req, prep.request_id, specs, prompt_tokens, echo)

    return await serve(state, raw, req.stream, prepare, response_headers(req))


def _echo_block(state, req, spec, plps):
    """(logprobs of the echoed prompt, text offset after it) or (None, 0) when not echoing them."""
    if not req.echo or req.logprobs is None:
        return None, 0
    return echo_logprobs(state.token_texts, spec.prompt_token_ids, plps, req.logprobs)


class CompletionFormatter(ChoicesFormatter):
    """Completions' wire format: ``text_completion`` chunks, or one ``CompletionResponse``.

    ``echo``: index -> the prompt text that opens the choice (echo). ``offsets``: index -> the
    text offset the next logprobs block starts at (after the echoed prompt, when it has logprobs)."""

    object_name = "text_completion"
    content_key = "text"

    def __init__(self, state: ServingState, req: CompletionRequest, request_id: str, specs: list[ChoiceSpec],
                 prompt_tokens: int, echo: dict[int, str | None]) -> None:
        super().__init__(state, req, request_id, specs, prompt_tokens)
        self.k, self.echo = req.logprobs, echo
        self.by_index = {s.index: s for s in specs}
        self.offsets = {s.index: 0 for s in specs}
        self.choices = {s.index: CompletionChoice(index=s.index, text=echo.get(s.index) or "",
                                                  logprobs=CompletionLogprobs() if self.k is not None else None)
                        for s in specs}

    def _logprobs(self, ev: ChoiceEvent):
        """The logprobs block of ``ev``'s generated tokens, or None; moves the choice's offset on."""
        if self.k is None or not ev.logprobs:
            return None
        block, self.offsets[ev.index] = completion_logprobs(self.state.token_texts, ev.logprobs, self.k,
                                                            self.offsets[ev.index])
        return block

    # ---- streaming ----------------------------------------------------------------------------
    def opening(self):
        for index in self.by_index:
            if self.echo.get(index) and self.k is None:     # with logprobs it waits for the prompt's
                yield self.chunk(index, self.echo[index])

    def event_chunks(self, ev: ChoiceEvent):
        if ev.prompt_logprobs is not None and self.echo.get(ev.index) is not None and self.k is not None:
            block, self.offsets[ev.index] = _echo_block(self.state, self.req, self.by_index[ev.index],
                                                        ev.prompt_logprobs)
            yield self.chunk(ev.index, self.echo[ev.index], block.model_dump())
        block = self._logprobs(ev)
        yield self.chunk(ev.index, ev.text, block.model_dump() if block is not None else None, ev.finish_reason,
                         ev.stop_reason, ev.token_ids)

    # ---- the whole answer ---------------------------------------------------------------------
    def fold(self, ev: ChoiceEvent) -> None:
        c = self.choices[ev.index]
        if ev.prompt_logprobs is not None:          # first event: the prompt's part comes first
            block, self.offsets[ev.index] = _echo_block(self.state, self.req, self.by_index[ev.index],
                                                        ev.prompt_logprobs)
            if block is not None:
                extend_logprobs(c.logprobs, block)
            if self.req.prompt_logprobs is not None:
                c.prompt_logprobs = prompt_logprobs_out(self.state.token_texts, ev.prompt_logprobs,
                                                        self.req.prompt_logprobs)
        c.text += ev.text
        if self.req.return_token_ids:
            c.token_ids = (c.token_ids or []) + ev.token_ids
        block = self._logprobs(ev)
        if block is not None:
            extend_logprobs(c.logprobs, block)
        if ev.finish_reason is not None:
            c.finish_reason, c.stop_reason = ev.finish_reason, ev.stop_reason

    def result(self) -> CompletionResponse:
        return CompletionResponse(id=self.request_id, model=self.model,
                                  choices=[self.choices[i] for i in sorted(self.choices)], usage=self.usage())
