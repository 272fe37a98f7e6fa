"""Stream migration of completions and chat completions streams: ``StreamTracker``, per choice.

A streamed ``/v1/completions`` or ``/v1/chat/completions`` request (no ``echo``, a single
prompt, any ``n``, structured outputs and tools included) is *migratable* (``migratable``).
``StreamTracker`` keeps what the client has been sent, per choice: the token ids, whether the
choice has finished; and the stream's ``id`` and ``created``. Besides the failures every
migratable stream moves on (gateway.migration), a choice aborted by the worker's drain
(``finish_reason "abort"`` with ``stop_reason "worker_shutdown"``) migrates.

n > 1: when the worker fails, each unfinished choice is resumed as a *leg*, an n = 1
continuation with its own ids (``StreamTracker.legs``, run side by side by
``gateway.failover``): its events get the choice's ``index`` back, choices that had finished
stay finished, and the legs' usage chunks become one (``summed_usage``) before ``[DONE]``.
Greedy choices equal the uninterrupted ones; sampled ones continue validly (choice ``i`` > 0
with seed ``seed + i``), not with the tokens the first worker would have drawn.

What the client sees (invariants): one stream, one ``id`` and ``created`` (later workers'
are rewritten), every generated token's text exactly once (the resuming worker replays the
ids through its detokenizer and stop matcher, so what the first one withheld comes out
once), one chat ``role`` chunk per choice, ``usage`` and ``finish_reason`` from the last
worker (it counts the continuation as output; summed over the legs for n > 1), completions'
``logprobs.text_offset`` counted from the start of the choice's whole text, ``token_ids``
only if the client asked for them, tool calls with the ids, names and arguments of the
worker that ended the choice (a chat choice's ``tool_calls`` deltas come in one burst at its
end). A migration is only made when, for every unfinished choice, every event with text
also carried its ids and no ``tool_calls`` delta has been sent (a worker lost inside that
burst is not resumed: its calls would come twice).
"""

from __future__ import annotations

import orjson

from gateway.migration.protocol import Migrate, ResumableStream, worker_failed
from gateway.streaming import DONE

MIGRATABLE_PATHS = ("/v1/completions", "/v1/chat/completions")
DRAIN_ABORT = "worker_shutdown"                          # worker.continuation: a drain aborted the choice


def migratable(path: str, body: dict) -> bool:
    """True for a streamed request whose choices' state a worker can rebuild from token ids (constrained
    ones included: a worker that cannot rebuild the grammar refuses the continuation)."""
    if path not in MIGRATABLE_PATHS or body.get("stream") is not True:
        return False
    n = body.get("n", 1)
    if not (n is None or isinstance(n, int) and n >= 1) or body.get("echo") \
            or body.get("continuation_token_ids") is not None:
        return False
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) and len(prompt) != 1:
        return False
    return True


class ChoiceState:
    """What the client has been sent of one choice."""

    __slots__ = ("token_ids", "ids_complete", "finished", "calls_sent", "started", "text_len", "offset_base")

    def __init__(self) -> None:
        self.token_ids: list[int] = []
        self.ids_complete = True         # every event with text carried its token ids
        self.finished = False            # it ended: nothing left to resume
        self.calls_sent = False          # a tool_calls delta went out: the choice is in its final burst
        self.started = False             # the client has its first event (and, for chat, its role)
        self.text_len = 0                # characters of generated text sent to the client
        self.offset_base = 0             # where the current worker's text starts (its text_offset 0)


class StreamTracker(ResumableStream):
    """What one migratable completions or chat stream has sent to the client, per choice.

    ``index`` set: a *leg*, choice ``index`` of an n > 1 stream resumed as an n = 1 request of its
    own (``legs``): its events' ``index`` 0 becomes ``index``, its usage chunk is kept for the
    stream's summed one (``summed_usage``) and its ``[DONE]`` is not the client's."""

    def __init__(self, body: dict, max_migrations: int, index: int | None = None,
                 choice: ChoiceState | None = None) -> None:
        super().__init__(body, max_migrations)
        self.index = index
        n = 1 if index is not None else body.get("n") or 1
        self.choices = {index: choice or ChoiceState()} if index is not None else {i: ChoiceState() for i in range(n)}
        self.id = self.created = None
        self.usage: dict | None = None   # a leg's usage chunk

    @classmethod
    def for_request(cls, path: str, body: dict, max_migrations: int) -> "StreamTracker | None":
        return cls(body, max_migrations) if max_migrations > 0 and migratable(path, body) else None

    @property
    def token_ids(self) -> list[int]:
        """The ids of a one-choice stream (or leg)."""
        (only,) = self.choices.values()
        return only.token_ids

    @property
    def finished(self) -> bool:
        return all(ch.finished for ch in self.choices.values())

    def resume(self) -> tuple[bytes, int]:
        """The next worker's body for a one-choice stream or a leg, and how many continuation tokens it
        must confirm (0: a plain re-run, when no token was generated yet)."""
        (ch,) = self.choices.values()
        ch.offset_base = ch.text_len
        return self._resumed(self.body, ch.token_ids)

    def can_migrate(self) -> bool:
        left = [ch for ch in self.choices.values() if not ch.finished]
        return (self.migrations < self.max_migrations and bool(left)
                and all(ch.ids_complete and not ch.calls_sent for ch in left))

    def done(self) -> bytes:
        """A leg's ``[DONE]`` is not the client's: gateway.failover ends the stream once every leg is over."""
        super().done()
        return b"" if self.index is not None else DONE

    def legs(self) -> list["StreamTracker"] | None:
        """An n > 1 stream's unfinished choices, each as an n = 1 request of its own (None for one choice,
        or a leg: it resumes whole). Choice ``i`` > 0 of a seeded request gets the seed ``seed + i`` (the
        first worker derived its own; either way the random generator restarts at the continuation)."""
        if len(self.choices) == 1:
            return None
        out = []
        for i, ch in self.choices.items():
            if ch.finished:
                continue
            body = {k: v for k, v in self.body.items() if k != "best_of"} | {"n": 1}
            if isinstance(body.get("seed"), int) and i:
                body["seed"] = (body["seed"] + i + 2**63) % 2**64 - 2**63
            leg = StreamTracker(body, self.max_migrations, i, ch)
            leg.id, leg.created, leg.migrations = self.id, self.created, self.migrations
            out.append(leg)
        return out

    def event(self, data: dict) -> tuple[dict | None, Migrate | None]:
        """One parsed ``data:`` object -> (what the client gets, or None; a Migrate to act on after it)."""
        err = data.get("error")
        if err is not None:
            migrate = worker_failed(err)
            return (None, migrate) if migrate is not None else (data, None)
        if self.id is None:
            self.id, self.created = data.get("id"), data.get("created")
        elif self.migrations:
            data["id"], data["created"] = self.id, self.created
        migrate, keep, choices = None, True, data.get("choices") or ()
        if not self.want_ids:
            data.pop("prompt_token_ids", None)          # what vLLM adds with return_token_ids
        if self.index is not None and not choices and data.get("usage"):
            self.usage = data                           # a leg's usage: summed into the stream's at its end
            return None, None
        for c in choices:
            if self.index is not None:
                c["index"] = self.index
            ch = self.choices.get(c.get("index", 0))
            ids = c.get("token_ids") if self.want_ids else c.pop("token_ids", None)
            if not self.want_ids:
                c.pop("prompt_token_ids", None)
            if ch is None:
                continue
            delta = c.get("delta")
            text = c.get("text") or (delta or {}).get("content")
            ch.text_len += len(text or "")
            lp = c.get("logprobs")
            if ch.offset_base and isinstance(lp, dict) and isinstance(lp.get("text_offset"), list):
                lp["text_offset"] = [o + ch.offset_base for o in lp["text_offset"]]   # completions' offsets
            calls = isinstance(delta, dict) and bool(delta.get("tool_calls"))
            ch.calls_sent = ch.calls_sent or calls
            if ids is None:
                ch.ids_complete = ch.ids_complete and not (text or calls)
            else:
                ch.token_ids.extend(ids)
                if not (self.want_ids or text or calls or c.get("finish_reason") or c.get("logprobs")
                        or data.get("usage") or (isinstance(delta, dict) and "role" in delta)):
                    keep = False         # only there for its ids (a token without text): not the client's
            if ch.started and isinstance(delta, dict) and "role" in delta and not text:
                keep = False             # a re-run's role chunk: the client has one
            if c.get("finish_reason") == "abort" and c.get("stop_reason") == DRAIN_ABORT:
                c["finish_reason"] = c["stop_reason"] = None
                migrate = Migrate("worker_drain", "the worker's drain time ran out")
                keep = bool(text or (self.want_ids and ids))
            elif c.get("finish_reason") is not None:
                ch.finished = True
            ch.started = ch.started or keep
        return (data if keep else None), migrate

    def summed_usage(self, legs: list["StreamTracker"]) -> bytes:
        """The usage chunk that ends an n > 1 stream whose choices were resumed as legs: the prompt once, and
        every choice's completion tokens (a leg's from its last worker, which counts its continuation; a
        choice that had finished before, its token ids). b"" when no leg reported usage (not asked for)."""
        reported = [leg.usage for leg in legs if leg.usage]
        if not reported:
            return b""
        resumed = {leg.index for leg in legs}
        done = sum(len(ch.token_ids) for i, ch in self.choices.items() if i not in resumed)
        completion = done + sum(u["usage"].get("completion_tokens") or 0 for u in reported)
        prompt = reported[0]["usage"].get("prompt_tokens") or 0
        chunk = {**reported[0], "id": self.id, "created": self.created,
                 "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                           "total_tokens": prompt + completion}}
        return b"data: " + orjson.dumps(chunk) + b"\n\n"
