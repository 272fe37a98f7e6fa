"""``POST /v1/completions``: ``protocol`` (the request and its checks), ``serving`` (handler, wire format)."""
