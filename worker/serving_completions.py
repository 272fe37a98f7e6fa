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
admission slot -> tokenise in the executor -> ``to_sampling_params`` per prompt ->
one engine request per choice (``ChoiceStreams``).
"""

from __future__ import annotations

import dataclasses
import json

from fastapi import Request, Response

from worker.continuation import response_headers
from worker.errors import APIError, bad_request
from worker.logprobs import completion_logprobs, echo_logprobs, extend_logprobs, prompt_logprobs_out
from worker.protocol import (CompletionChoice, CompletionLogprobs, CompletionRequest, CompletionResponse,
                             UsageInfo, child_seed, now, to_sampling_params, validate_request)
from worker.serving import (SSE_DONE, ChoiceSpec, ChoiceStreams, ClientDisconnected, GuardedStreamingResponse,
                            ServingState, engine_error, monotonic, new_id, sse, until_disconnect, with_headers)


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
    validate_request(req, state.config.max_logprobs)
    prompt = req.prompt
    n_prompts = len(prompt) if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) else 1
    limit = state.config.max_choices_per_request
    if n_prompts * req.n > limit:
        raise bad_request(f"{n_prompts} prompts x n={req.n} = {n_prompts * req.n} choices exceed this worker's "
                          f"limit of {limit} per request.", "n")
    state.check_engine()
    state.check_prompt_logprobs(req)
    arrival = monotonic()
    state.admit()
    handed_over = False
    try:
        prompts = await state.run_sync(_tokenize, state.tokenizer, req.prompt, req.add_special_tokens,
                                       req.truncate_prompt_tokens, bool(req.echo), state.vocab_size)
        specs: list[ChoiceSpec] = []
        cont = list(req.continuation_token_ids or [])
        if any(t >= state.vocab_size for t in cont):
            raise bad_request(f"continuation_token_ids must be < the vocabulary size {state.vocab_size}.",
                              "continuation_token_ids")
        request_id = new_id("cmpl")
        max_model_len = state.engine.max_model_len
        for p_idx, (ids, _) in enumerate(prompts):
            if not ids:
                raise bad_request("The prompt is empty after tokenisation.", "prompt")
            if any(t >= state.vocab_size for t in ids):
                raise bad_request(f"Prompt token ids must be < the vocabulary size {state.vocab_size}.", "prompt")
            base = to_sampling_params(req, prompt_len=len(ids) + len(cont), max_model_len=max_model_len,
                                      vocab_size=state.vocab_size, done=len(cont))
            for i in range(req.n):
                index = p_idx * req.n + i
                params = dataclasses.replace(base, seed=child_seed(base.seed, i)) if i else base
                specs.append(ChoiceSpec(index, f"{request_id}-{index}", ids, params, req.skip_special_tokens,
                                        req.score_only, cont, req.min_tokens, bool(req.return_token_ids)))
        echo = {s.index: prompts[s.index // req.n][1] for s in specs} if req.echo else {}
        prompt_tokens = sum(len(ids) for ids, _ in prompts)
        if req.stream:
            body = _stream(state, req, request_id, specs, echo, prompt_tokens, arrival)
            handed_over = True
            return GuardedStreamingResponse(body, on_close=state.release, headers=response_headers(req))
        try:
            out = await until_disconnect(raw, _full(state, req, request_id, specs, echo, prompt_tokens, arrival))
            return with_headers(out, response_headers(req))
        except ClientDisconnected:
            return Response(status_code=499)
    finally:
        if not handed_over:
            state.release()


def _echo_block(state, req, spec, plps):
    """(logprobs of the echoed prompt, text offset after it) or (None, 0) when not echoing them."""
    if not req.echo or req.logprobs is None:
        return None, 0
    return echo_logprobs(state.token_texts, spec.prompt_token_ids, plps, req.logprobs)


async def _full(state, req, request_id, specs, echo, prompt_tokens, arrival) -> CompletionResponse:
    k = req.logprobs
    by_index = {s.index: s for s in specs}
    choices = {s.index: CompletionChoice(index=s.index, text=echo.get(s.index) or "",
                                         logprobs=CompletionLogprobs() if k is not None else None) for s in specs}
    offsets = {s.index: 0 for s in specs}
    out_tokens = {s.index: 0 for s in specs}
    events = ChoiceStreams(state, specs, arrival).events()
    try:
        async for ev in events:
            c = choices[ev.index]
            if ev.prompt_logprobs is not None:          # first event: the prompt's part comes first
                block, offsets[ev.index] = _echo_block(state, req, by_index[ev.index], ev.prompt_logprobs)
                if block is not None:
                    extend_logprobs(c.logprobs, block)
                if req.prompt_logprobs is not None:
                    c.prompt_logprobs = prompt_logprobs_out(state.token_texts, ev.prompt_logprobs,
                                                            req.prompt_logprobs)
            c.text += ev.text
            if req.return_token_ids:
                c.token_ids = (c.token_ids or []) + ev.token_ids
            out_tokens[ev.index] = ev.num_output_tokens
            if k is not None and ev.logprobs:
                block, offsets[ev.index] = completion_logprobs(state.token_texts, ev.logprobs, k, offsets[ev.index])
                extend_logprobs(c.logprobs, block)
            if ev.finish_reason is not None:
                c.finish_reason, c.stop_reason = ev.finish_reason, ev.stop_reason
    except Exception as exc:  # noqa: BLE001 - mapped to an OpenAI error
        raise engine_error(exc) from exc
    finally:
        await events.aclose()
    completion_tokens = sum(out_tokens.values())
    return CompletionResponse(
        id=request_id, model=state.config.model_name, choices=[choices[i] for i in sorted(choices)],
        usage=UsageInfo(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                        total_tokens=prompt_tokens + completion_tokens))


def _dumps(obj: dict) -> str:
    return sse(json.dumps(obj, ensure_ascii=False, separators=(",", ":")))


async def _stream(state, req, request_id, specs, echo, prompt_tokens, arrival):
    created, model, k = now(), state.config.model_name, req.logprobs
    include_usage, continuous = req.include_usage, req.continuous_usage
    prompt_len = {s.index: len(s.prompt_token_ids) for s in specs}
    offsets = {s.index: 0 for s in specs}
    out_tokens = {s.index: 0 for s in specs}

    def chunk(index: int, text: str, logprobs=None, finish=None, stop=None, token_ids=None) -> str:
        obj = {"id": request_id, "object": "text_completion", "created": created, "model": model,
               "choices": [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish,
                            "stop_reason": stop}]}
        if req.return_token_ids:
            obj["choices"][0]["token_ids"] = token_ids or []
        if continuous:
            n = out_tokens[index]
            obj["usage"] = {"prompt_tokens": prompt_len[index], "completion_tokens": n,
                            "total_tokens": prompt_len[index] + n}
        elif include_usage:
            obj["usage"] = None
        return _dumps(obj)

    by_index = {s.index: s for s in specs}
    streams = ChoiceStreams(state, specs, arrival)
    events = streams.events()
    try:
        for s in specs:
            if echo.get(s.index) and k is None:
                yield chunk(s.index, echo[s.index])
        async for ev in events:
            out_tokens[ev.index] = ev.num_output_tokens
            if ev.prompt_logprobs is not None and echo.get(ev.index) is not None and k is not None:
                block, offsets[ev.index] = _echo_block(state, req, by_index[ev.index], ev.prompt_logprobs)
                yield chunk(ev.index, echo[ev.index], block.model_dump())
            lp = None
            if k is not None and ev.logprobs:
                block, offsets[ev.index] = completion_logprobs(state.token_texts, ev.logprobs, k, offsets[ev.index])
                lp = block.model_dump()
            yield chunk(ev.index, ev.text, lp, ev.finish_reason, ev.stop_reason, ev.token_ids)
        if include_usage:
            n = sum(out_tokens.values())
            yield _dumps({"id": request_id, "object": "text_completion", "created": created, "model": model,
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
