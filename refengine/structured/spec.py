"""What a request's output must match: the one constraint object the engine understands. No torch.

The HTTP edge turns every way a client can ask for structured output (OpenAI's
``response_format``, vLLM's ``structured_outputs`` and the older ``guided_*`` fields,
``tool_choice`` "required" or a named function) into one ``StructuredSpec``; the engine
compiles it (``refengine.structured.grammar``) and masks the sampler with it.

``text`` is canonical (a schema is JSON with sorted keys), so two requests asking the
same thing give equal, hashable specs: the compiled-grammar cache is keyed by them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["json", "regex", "choice", "grammar", "lark"]


@dataclass(frozen=True)
class StructuredSpec:
    kind: Kind
    text: str                                  # json: the schema (JSON); choice: a JSON list of strings;
                                               # regex; grammar: GBNF or Lark; lark: Lark only (tools)
    whitespace_pattern: str | None = None      # json: the whitespace allowed between tokens (None: none)

    def describe(self) -> str:
        body = self.text if len(self.text) <= 60 else self.text[:57] + "..."
        return f"{self.kind}: {body}"
