"""``POST /v1/chat/completions``: ``protocol`` (the request and its checks), ``prompt`` (messages, tools and
the chat template, shared with /v1/responses and /tokenize), ``serving`` (handler, wire format)."""
