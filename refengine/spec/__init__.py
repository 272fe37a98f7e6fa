"""Speculative decoding for prompt-heavy outputs: model-free drafts, verified in one forward pass. No torch here.

Layout (one job per module):
  config     ``SpecConfig``: vLLM's ``--speculative-config`` keys (method ``suffix`` or ``ngram``), parsed once
  index      ``TokenIndex``: one token sequence indexed by its bigrams; longest-suffix match + the frequency
             tree of what followed the matches (the per-request suffix structure over prompt + output)
  corpus     ``OutputCorpus``: the bounded global store of recent outputs of this engine's model
  drafter    ``Drafter``: proposes each decoding request's draft before the scheduler runs; the step
             budget that backs off under load (``num_speculative_tokens_per_batch_size``); counters
  verify     (torch) acceptance of a request's drafts from its k+1 rows of logits: exact for greedy,
             the standard rejection rule for sampling (drafts are point masses: accept with p(d))

The engine step stays schedule -> run -> update: the drafter runs at the start of ``step`` and
leaves each request's draft in ``Request.spec_token_ids``; the scheduler gives such a request
``1 + len(draft)`` tokens; the runner verifies them; the scheduler's update appends the accepted
tokens and the bonus token and rolls ``num_computed_tokens`` back to the tokens that were kept.
"""
