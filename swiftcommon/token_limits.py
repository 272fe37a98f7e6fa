"""The one rule for how many tokens a request may generate, read by the gateway and the worker.

Which field limits the output, per endpoint (OpenAI's API; the worker serves by it):
- chat: ``max_completion_tokens`` (OpenAI's current field) wins over ``max_tokens`` (its
  deprecated alias, still sent by many clients); neither: the rest of the context;
- completions: ``max_tokens`` only (default ``DEFAULT_COMPLETION_TOKENS``; an explicit null:
  the rest of the context); ``max_completion_tokens`` is not a completions field;
- responses: ``max_output_tokens`` only.
The worker's request models (``worker.api``) apply it to validated requests and ``gateway.auth``
to raw bodies for its admission estimate, so a client's token budget is charged for what the
worker generates.

Contract: pure functions of plain values; imports nothing of the project.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# /v1/completions' max_tokens when the request leaves it out (OpenAI's and vLLM's default).
DEFAULT_COMPLETION_TOKENS = 16

# Per endpoint, the fields that limit a request's output: the first one set wins.
LIMIT_FIELDS = {
    "chat": ("max_completion_tokens", "max_tokens"),
    "completions": ("max_tokens",),
    "responses": ("max_output_tokens",),
}


def endpoint_of(body: Mapping) -> str:
    """Which endpoint a raw JSON body is for, by its shape (``input``: responses, ``messages``: chat)."""
    return "responses" if "input" in body else "chat" if "messages" in body else "completions"


def requested_limit(endpoint: str, fields: Mapping) -> Any:
    """The first of ``LIMIT_FIELDS[endpoint]`` set (not None) in ``fields`` (a raw body or a request's
    values, unchecked: the worker refuses bad ones), else None: the caller's default applies."""
    for name in LIMIT_FIELDS[endpoint]:
        value = fields.get(name)
        if value is not None:
            return value
    return None
