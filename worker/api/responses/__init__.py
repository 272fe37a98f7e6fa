"""``POST /v1/responses``, the OpenAI Responses API: ``protocol`` (its request and checks), ``items`` (its
input items and tools), ``models`` (the Response object and its output items), ``serving`` (handler,
event stream)."""
