"""``POST /tokenize`` and ``POST /detokenize`` (vLLM's shapes): ``protocol`` and ``serving``."""
