"""Stream migration: which streams may move to another worker, and what the client sees of them.

A streamed completions, chat or Responses request is *migratable* (``tracker_for`` gives its
tracker, None for any other request): the gateway asks the worker for the generated token ids
(``return_token_ids``, vLLM's field) and parses every SSE event through the tracker of its API,
each behind the one protocol of gateway.migration.protocol:

* ``completions``: ``/v1/completions`` and ``/v1/chat/completions`` (``StreamTracker``, per choice);
* ``responses``: ``/v1/responses`` (``ResponsesTracker``, one generation).

When the worker fails after the first byte (connection lost, stream cut before its end, no
byte for ``--stall-timeout``, an in-band error whose code says the engine or worker failed,
a drain that ran out), gateway.failover re-sends the request to another worker with
``continuation_token_ids`` = the ids the client has (``worker.continuation``): that worker
resumes exactly after them (advancing a constraint's grammar and replaying the tool-call
holding through them), and its events continue the same stream. A resuming worker must
confirm the continuation with its ``x-swiftserve-continuation`` header (a server that would
ignore the field, such as stock vLLM, is not trusted with it); a worker whose engine cannot
rebuild a grammar (the vLLM engine) refuses a constrained continuation with a 400, and the
gateway tries another one. When no migration is possible the failure ends the stream with
an error event, as for any other stream (gateway.relay).
"""

from __future__ import annotations

from gateway.migration.completions import StreamTracker, migratable
from gateway.migration.protocol import CONTINUATION_HEADER, Migrate, ResumableStream, rewrite
from gateway.migration.responses import RESPONSES, ResponsesTracker

__all__ = ["CONTINUATION_HEADER", "Migrate", "ResumableStream", "ResponsesTracker", "StreamTracker", "migratable",
           "rewrite", "tracker_for"]


def tracker_for(path: str, body: dict, max_migrations: int) -> ResumableStream | None:
    """The tracker of a migratable request (``body`` is what goes upstream), else None (or migration off)."""
    kind = ResponsesTracker if path == RESPONSES else StreamTracker
    return kind.for_request(path, body, max_migrations)
