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
* in a chat stream, sends no ``role`` chunk (the client has it from the first worker);
* answers with the header ``x-swiftserve-continuation: <n>`` (n continuation tokens
  applied), so a gateway can tell a worker that honours the field from one that would
  silently ignore it (a stock vLLM server).

Guarantee: for greedy requests (temperature 0) the joined output is token-for-token the
uninterrupted one (same weights, same engine kind). A seeded sampled request continues
with the same seed, but the RNG restarts at the continuation, so the rest is a valid
sample from the same distribution, not the tokens the first worker would have drawn.
``presence_penalty`` / ``frequency_penalty`` (computed over output tokens) see the
continuation as prompt, so they do not count it; ``repetition_penalty`` (prompt and
output) does.

Refused (400): n > 1, ``echo``, structured outputs and tool plans (their state is not
rebuilt), several prompts, and a continuation that already uses up ``max_tokens``.

``DRAIN_ABORT``: the ``stop_reason`` of a choice aborted because the worker's drain time
ran out (``worker.shutdown``), with ``finish_reason: "abort"``; a gateway migrates such a
stream instead of ending it.
"""

from __future__ import annotations

from worker.errors import bad_request
from worker.structured import structured_spec

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
    if req.n != 1:
        raise bad_request("continuation_token_ids needs n = 1 (one generation to resume).", param)
    if getattr(req, "echo", False):
        raise bad_request("continuation_token_ids cannot be combined with echo.", param)
    if structured_spec(req) is not None:
        raise bad_request("continuation_token_ids cannot be combined with structured outputs (the grammar's "
                          "state is not rebuilt).", param)
    if getattr(req, "tools", None) and getattr(req, "tool_choice", None) != "none":
        raise bad_request("continuation_token_ids cannot be combined with tools.", param)
    prompt = getattr(req, "prompt", None)
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) and len(prompt) != 1:
        raise bad_request("continuation_token_ids needs a single prompt.", param)
    limit = req.requested_max_tokens()
    if limit is not None and len(ids) >= limit:
        raise bad_request(f"continuation_token_ids has {len(ids)} tokens: nothing is left of max_tokens "
                          f"({limit}).", param)


def response_headers(req) -> dict[str, str] | None:
    """The marker header of a continuation answer (None for an ordinary request)."""
    ids = req.continuation_token_ids
    return {CONTINUATION_HEADER: str(len(ids))} if ids else None
