"""Resuming a generation on this worker: what a *continuation* request may be, and its markers.

A gateway that lost a worker mid-stream re-sends the request to another worker with
``continuation_token_ids``: the token ids already generated (and sent to the client).
The worker then

* tokenises the prompt as usual and gives the engine ``prompt + continuation`` as its
  prompt (token ids: nothing is re-tokenised, so the engine sees exactly the sequence
  the first worker had);
* feeds the continuation through the choice's detokenizer and stop-string matcher
  without reporting it, so both are in the state the first worker was in: a multi-byte
  character or a possible stop-string prefix that the first worker withheld comes out
  here, nothing is repeated and nothing is lost;
* reduces ``max_tokens`` and ``min_tokens`` by the continuation's length;
* reports only what comes after the continuation (text, ``token_ids``, logprobs), but
  ``usage`` and ``finish_reason`` for the whole generation: ``completion_tokens`` counts
  the continuation too, so a client joining the two outputs has the uninterrupted answer;
* under a constraint (structured outputs, ``tool_choice`` "required" or a named function)
  has the engine advance the grammar through the continuation before it masks the next
  token (``SamplingParams.structured_prefix``), so the constraint is where the first
  worker left it, never restarted;
* with a tool plan, replays the continuation's text through the chat stream's tool-call
  holding (``worker.api.chat.serving``) without reporting it: a call the first worker was
  holding back is held here too and sent whole (ids, names, arguments) at the end, and
  text it had already released as content is not sent again;
* in a chat stream, sends no ``role`` chunk (the client has it from the first worker); in a
  ``/v1/responses`` stream (streams only) no ``response.created`` / ``in_progress`` and no
  message item the first worker had opened, while its closing events and terminal response
  hold the whole text (``worker.api.responses.serving``);
* answers with the header ``x-swiftserve-continuation: <n>`` (n continuation tokens
  applied), so a gateway can tell a worker that honours the field from one that would
  silently ignore it (a stock vLLM server).

Guarantee: for greedy requests (temperature 0) the joined output is token-for-token the
uninterrupted one (same weights, same engine kind) when greedy tokens do not depend on the
batch (float32 on CPU; in bfloat16 greedy tokens were measured to change with what else is
in the batch, fault or not, so there the joined output is a greedy continuation, not
necessarily the same tokens: results/reliability/README.md). A seeded sampled request continues
with the same seed, but the RNG restarts at the continuation, so the rest is a valid
sample from the same distribution, not the tokens the first worker would have drawn.
``presence_penalty`` / ``frequency_penalty`` (computed over output tokens) see the
continuation as prompt, so they do not count it; ``repetition_penalty`` (prompt and
output) does.

Tool calls keep their ids: a choice's calls are sent in one burst when it ends, by the
worker that ends it, so no call is split between workers (a gateway does not move a
stream whose burst had begun, ``gateway.migration``).

Refused (400): n > 1 (a gateway resumes each choice of an n > 1 stream with an n = 1
continuation of its own, ``gateway.migration``), ``echo``, several prompts, a continuation that already uses up
``max_tokens``, tools without ``stream`` (a whole answer's ``tool_calls`` are parsed from
the whole output, which this worker does not have), and a constrained continuation on an
engine that cannot advance a grammar through tokens it did not generate (the vLLM engine:
``constrained_continuation_refusal``; it is refused, never run with a restarted grammar).
A continuation that its constraint does not accept fails that request in the engine.

``DRAIN_ABORT``: the ``stop_reason`` of a choice aborted because the worker's drain time
ran out (``worker.shutdown``), with ``finish_reason: "abort"`` (a Responses stream ends with
``response.failed``, code ``shutting_down``); a gateway migrates such a stream instead of
ending it.
"""

from __future__ import annotations

from worker.errors import bad_request

CONTINUATION_HEADER = "x-swiftserve-continuation"
DRAIN_ABORT = "worker_shutdown"


def check_continuation(req) -> None:
    """Refuse (400) a continuation this worker cannot resume exactly. Needs no tokenizer."""
    ids = req.continuation_token_ids
    if ids is None:
        return
    param = "continuation_token_ids"
    if not ids:
        raise bad_request("continuation_token_ids must not be empty (leave it out to start a generation).", param)
    if any(t < 0 for t in ids):
        raise bad_request("continuation_token_ids must be non-negative token ids.", param)
    if getattr(req, "n", 1) != 1:
        raise bad_request("continuation_token_ids needs n = 1 (one generation to resume).", param)
    if getattr(req, "echo", False):
        raise bad_request("continuation_token_ids cannot be combined with echo.", param)
    if getattr(req, "tools", None) and getattr(req, "tool_choice", None) != "none" and not req.stream:
        raise bad_request("continuation_token_ids with tools needs stream: true (a whole answer's tool calls are "
                          "parsed from the whole output).", param)
    prompt = getattr(req, "prompt", None)
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) and len(prompt) != 1:
        raise bad_request("continuation_token_ids needs a single prompt.", param)
    limit = req.requested_max_tokens()
    if limit is not None and len(ids) >= limit:
        raise bad_request(f"continuation_token_ids has {len(ids)} tokens: nothing is left of max_tokens "
                          f"({limit}).", param)


def check_constrained(engine, req, constrained: bool) -> None:
    """Refuse (400) a continuation under a constraint when ``engine`` cannot rebuild the grammar's state."""
    refusal = getattr(engine, "constrained_continuation_refusal", None)
    if constrained and req.continuation_token_ids and refusal:
        raise bad_request(refusal, "continuation_token_ids")


def response_headers(req) -> dict[str, str] | None:
    """The marker header of a continuation answer (None for an ordinary request)."""
    ids = req.continuation_token_ids
    return {CONTINUATION_HEADER: str(len(ids))} if ids else None
