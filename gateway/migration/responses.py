"""Stream migration of ``/v1/responses`` streams: what the client has been sent, and how a resumed one continues.

A streamed Responses request is migratable as a chat one is (gateway.migration): the
gateway asks the worker for ``return_token_ids`` (the worker then adds ``swiftserve.token_ids``
events, stripped unless the client asked for them) and, when the worker fails after the first
byte, re-sends the request with ``continuation_token_ids`` to another worker
(``worker.continuation``; the worker replays the ids through its text and tool-call state and
sends no ``response.created`` / ``response.in_progress`` and no message item the client has).
``ResponsesTracker`` keeps the stream whole for the client:

- one response: the resumed worker's response ``id`` and ``created_at`` are rewritten to the
  first one's, and its message item's id (``item.id``, ``item_id``, the message in
  ``response.output``) to the first message item's;
- ``sequence_number`` counts every event the client gets, across workers, from 0;
- failures: an in-band ``response.failed`` whose error code says the worker or its engine
  failed (``engine_error``, ``shutting_down``: a worker's drain ran out) migrates, as do a
  lost connection, a stream cut before its terminal event, and a stall; the terminal event
  (``response.completed`` / ``incomplete`` / ``failed``) ends the stream (no ``[DONE]``).

Not resumed (the failure ends the stream with the error event, as before): once the worker
said its generation ended (its last ``swiftserve.token_ids`` event carries ``finish_reason``
and comes before the last text; what follows is the closing burst: ``output_text.done``,
function calls, the terminal event), or when a text delta came without its ids (a delta
carries the ids of its text as ``token_ids``).
"""

from __future__ import annotations

from gateway.migration.protocol import Migrate, ResumableStream, worker_failed
from gateway.streaming import RESPONSES_TERMINAL

RESPONSES = "/v1/responses"
IDS_EVENT = "swiftserve.token_ids"


class ResponsesTracker(ResumableStream):
    """What one migratable Responses stream (one generation: it resumes whole) has sent."""

    def __init__(self, body: dict, max_migrations: int) -> None:
        super().__init__(body, max_migrations)
        self.token_ids: list[int] = []
        self.ids_complete = True         # every event with text carried its ids
        self.generated = False           # the worker said its generation ended: the closing burst follows
        self.seq = 0                     # the next sequence_number the client gets
        self.response = None             # (id, created_at) of the first worker's response
        self.msg_id = None               # the first message item's id

    @classmethod
    def for_request(cls, path: str, body: dict, max_migrations: int) -> "ResponsesTracker | None":
        ok = path == RESPONSES and body.get("stream") is True and body.get("continuation_token_ids") is None
        return cls(body, max_migrations) if max_migrations > 0 and ok else None

    @property
    def finished(self) -> bool:
        return self.ended                # its terminal event went out

    def resume(self) -> tuple[bytes, int]:
        return self._resumed(self.body, self.token_ids)

    def can_migrate(self) -> bool:
        return (self.migrations < self.max_migrations and self.ids_complete
                and not (self.generated or self.ended))

    def _same_ids(self, data: dict) -> None:
        resp = data.get("response")
        if isinstance(resp, dict):
            if self.response is None:
                self.response = resp.get("id"), resp.get("created_at")
            else:
                resp["id"], resp["created_at"] = self.response
            for item in resp.get("output") or ():
                self._same_item(item)
        self._same_item(data.get("item"))
        if self.msg_id is not None and str(data.get("item_id", "")).startswith("msg"):
            data["item_id"] = self.msg_id

    def _same_item(self, item) -> None:
        if isinstance(item, dict) and item.get("type") == "message":
            if self.msg_id is None:
                self.msg_id = item.get("id")
            else:
                item["id"] = self.msg_id

    def event(self, data: dict) -> tuple[dict | None, Migrate | None]:
        """One parsed ``data:`` object -> (what the client gets, or None; a Migrate to act on after it)."""
        kind = data.get("type")
        if kind == IDS_EVENT:
            self.token_ids.extend(data.get("token_ids") or ())
            self.generated = self.generated or data.get("finish_reason") is not None
            return (data if self.want_ids else None), None
        if kind == "response.failed":
            migrate = worker_failed((data.get("response") or {}).get("error"))
            if migrate is not None:
                return None, migrate
        if kind == "response.output_text.delta":
            ids = data.get("token_ids") if self.want_ids else data.pop("token_ids", None)
            if ids is not None:
                self.token_ids.extend(ids)
            elif data.get("delta") and not self.generated:
                self.ids_complete = False
        self._same_ids(data)
        if "sequence_number" in data:
            data["sequence_number"], self.seq = self.seq, self.seq + 1
        self.ended = self.ended or kind in RESPONSES_TERMINAL
        return data, None
