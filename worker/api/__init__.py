"""The worker's HTTP endpoints, one package per API.

``completions``, ``chat``, ``responses`` (the OpenAI Responses API, and only it) and
``tokenize`` each hold their ``protocol`` (the request model and its checks) and their
``serving`` (the handler and its wire format). What they share sits beside them:
``base_request`` (the request base every API model derives from), ``sampling`` (the sampling
fields of completions and chat, and the one conversion of any API's request to the engine's
``SamplingParams``), ``prepare`` (the request-preparation step every generation endpoint runs:
request id, compiled constraint and engine parameters, each computed once), ``driver`` (the
HTTP side of a generation: admission, streaming or one answer), ``choice_models`` and
``logprobs`` (the output models and logprob formats of the choice-based APIs, completions and
chat; the Responses API's are ``responses.models``).
"""
