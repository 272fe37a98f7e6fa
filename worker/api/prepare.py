"""The request-preparation step every generation endpoint runs: id, constraint, engine parameters, once.

An endpoint first runs its API's own checks, which build the request's output constraint exactly
once (``worker.api.sampling.validate_sampling`` for completions and chat, the Responses API's
``text.format`` in ``worker.api.responses.protocol``), and its tool plan where it has tools
(``worker.tools.plan``). Then ``Preparation(state, req, prefix, constraint, plan)``, built once
per request, is what every later step reads:

- ``request_id``: ``<prefix>-<hex>``; the engine request ids derive from it;
- ``structured``: the one constraint the engine enforces (the schema of ``tool_choice``
  "required" or a named function, else the output constraint; both at once are refused), and
  a constrained continuation refused on an engine that cannot resume one
  (``worker.continuation.check_constrained``);
- ``compile()``: every constraint of the request (the output constraint, each tool's schema, the
  tool choice's) compiled together, once, before admission (``ServingState.check_constraints``);
- ``params(prompt_len)``: after admission, the one conversion to the engine's ``SamplingParams``
  (``worker.api.sampling.to_sampling_params``, with ``structured``) for a prompt of that many
  tokens, the continuation (``continuation_ids``, range-checked once) counted in the engine's
  context. Completions call it once per prompt of a batch; chat and Responses once.

Nothing here knows an API's field names beyond those the request model declares (its
``sampling()``), so an error names the field of the API the client called.
"""

from __future__ import annotations

from refengine.sampling_params import SamplingParams
from worker.api.sampling import Constraint, to_sampling_params
from worker.continuation import check_constrained
from worker.errors import bad_request
from worker.serving import ServingState, new_id


class Preparation:
    def __init__(self, state: ServingState, req, prefix: str, constraint: Constraint | None, plan=None) -> None:
        self.state, self.req = state, req
        self.request_id = new_id(prefix)
        self.constraint, self.plan = constraint, plan
        tool_spec = plan.spec if plan is not None else None
        if tool_spec is not None and constraint is not None:
            raise bad_request("tool_choice 'required' or a named function cannot be combined with a structured-output "
                              "constraint.", "tool_choice")
        self.structured = tool_spec if tool_spec is not None else constraint[1] if constraint is not None else None
        check_constrained(state.engine, req, self.structured is not None)
        self._continuation: list[int] | None = None

    async def compile(self) -> None:
        """Compile the request's constraints (once; 400 naming the first that cannot be used)."""
        items = ([self.constraint] if self.constraint is not None else []) + (self.plan.checks if self.plan else [])
        await self.state.check_constraints(items)

    def continuation_ids(self) -> list[int]:
        """The ids a continuation resumes after (worker.continuation), checked against the vocabulary."""
        if self._continuation is None:
            cont = list(self.req.continuation_token_ids or [])
            if any(t >= self.state.vocab_size for t in cont):
                raise bad_request(f"continuation_token_ids must be < the vocabulary size {self.state.vocab_size}.",
                                  "continuation_token_ids")
            self._continuation = cont
        return self._continuation

    def params(self, prompt_len: int) -> SamplingParams:
        """The engine's parameters for a prompt of ``prompt_len`` tokens (the continuation not counted in it)."""
        done = len(self.continuation_ids())
        return to_sampling_params(self.req, prompt_len=prompt_len + done, max_model_len=self.state.engine.max_model_len,
                                  vocab_size=self.state.vocab_size, done=done, structured=self.structured)
