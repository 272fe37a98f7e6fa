"""``SpecConfig``: what ``--speculative-config`` says, in vLLM's keys. No torch.

The value is vLLM's JSON object (``vllm serve --speculative-config '{...}'``); the reference
engine implements its two model-free methods:

- ``"suffix"`` (suffix decoding, ArcticInference / vLLM): each request is matched against its own
  prompt + output and against a bounded corpus of recent outputs (``suffix_decoding_*`` keys);
- ``"ngram"`` (prompt lookup): the request's own tokens only, match lengths between
  ``prompt_lookup_min`` and ``prompt_lookup_max``, a fixed draft of the tokens that followed.

Keys (vLLM 0.32's names and defaults where vLLM has the key):
  method, num_speculative_tokens (the most drafted tokens per step; suffix default: the tree depth)
  suffix_decoding_max_tree_depth (24), suffix_decoding_max_cached_requests (10000; 0: no corpus),
  suffix_decoding_max_spec_factor (1.0), suffix_decoding_min_token_prob (0.1)
  suffix_decoding_corpus_tokens (1048576; vLLM's Model Runner V2 name: the corpus's token cap)
  prompt_lookup_max / prompt_lookup_min (ngram)
  num_speculative_tokens_per_batch_size: vLLM's dynamic schedule ``[[lo, hi, k], ...]`` (inclusive
      batch-size ranges -> the most drafted tokens per request); the load-aware back-off. Default:
      ``DEFAULT_SCHEDULE``, from the step-time knee measured on this project's 2-core CPU
Any other vLLM key (a draft ``model``, EAGLE options) is refused with a message naming it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

METHODS = ("suffix", "ngram")
# Default back-off. A decode step of SmolLM2 on this project's 2-core CPU (float32: the CPU has no AVX-512)
# costs about T0 + c * n for n verified rows, with a fixed part T0 (Python, dispatch, sampling, weight reads)
# of ~60 ms and c ~7.5 ms a row (studies/spec_knee.py, results/spec/knee.md). Below n = T0 / c (~8) the fixed
# part dominates: the step is overhead-bound and a drafted token costs little; past it every row is compute.
# So the drafts of a step are kept within KNEE_TOKENS rows: b running requests draft at most
# KNEE_TOKENS // b - 1 tokens each, and none from b = KNEE_TOKENS // 2 + 1 on (a step is then exactly the
# step without speculation).
# Except a request running alone (LONE_TOKENS, then capped by num_speculative_tokens): its draft is
# already bounded by its match length (max_spec_factor) and estimated probability, and a long match
# (a quoted span) is accepted most of the way, so a 17-row step that emits 17 tokens costs
# ~60 + 17 x 7.5 ms against 17 plain steps. Simulated on recorded greedy outputs of the prompt-heavy set
# with that step-cost model (studies/spec_policy.py, results/spec/policy.md): a cap of 24 instead of
# 7 at one request makes the modelled decode ~4% faster; served, 1.704x against 1.676x (within the
# run-to-run spread; results/spec/README.md, round 2).
KNEE_TOKENS = 8
LONE_TOKENS = 64


def schedule_for(knee_tokens: int, lone_tokens: int = LONE_TOKENS) -> tuple[tuple[int, int, int], ...]:
    """vLLM's ``num_speculative_tokens_per_batch_size`` rows that keep a step within ``knee_tokens`` rows
    (one running request: ``lone_tokens``)."""
    rows = [(1, 1, max(lone_tokens, knee_tokens - 1))]
    for b in range(2, knee_tokens // 2 + 1):
        k = knee_tokens // b - 1
        if k < 1:
            break
        if rows and rows[-1][2] == k:
            rows[-1] = (rows[-1][0], b, k)
        else:
            rows.append((b, b, k))
    return tuple(rows)


DEFAULT_SCHEDULE = schedule_for(KNEE_TOKENS)
INT_KEYS = ("num_speculative_tokens", "suffix_decoding_max_tree_depth", "suffix_decoding_max_cached_requests",
            "suffix_decoding_corpus_tokens", "prompt_lookup_max", "prompt_lookup_min")
FLOAT_KEYS = ("suffix_decoding_max_spec_factor", "suffix_decoding_min_token_prob")


class SpecConfigError(ValueError):
    """A ``--speculative-config`` value that cannot be used; the message names the key."""


@dataclass(frozen=True)
class SpecConfig:
    method: str = "suffix"
    num_speculative_tokens: int = 24
    suffix_decoding_max_tree_depth: int = 24
    suffix_decoding_max_cached_requests: int = 10000
    suffix_decoding_max_spec_factor: float = 1.0
    suffix_decoding_min_token_prob: float = 0.1
    suffix_decoding_corpus_tokens: int = 1 << 20
    prompt_lookup_max: int = 5
    prompt_lookup_min: int = 2
    num_speculative_tokens_per_batch_size: tuple[tuple[int, int, int], ...] = field(default=DEFAULT_SCHEDULE)

    @classmethod
    def parse(cls, value) -> "SpecConfig | None":
        """JSON text, a dict, a ``SpecConfig`` or None/"" (speculation off) -> the config (SpecConfigError)."""
        if value is None or isinstance(value, SpecConfig):
            return value
        if isinstance(value, str):
            if not value.strip():
                return None
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise SpecConfigError(f"--speculative-config is not JSON: {exc}") from None
        if not isinstance(value, dict):
            raise SpecConfigError("--speculative-config must be a JSON object, e.g. "
                                  '\'{"method": "suffix", "num_speculative_tokens": 16}\'')
        d = dict(value)
        known = {"method", *INT_KEYS, *FLOAT_KEYS, "num_speculative_tokens_per_batch_size"}
        for key in d:
            if key not in known:
                raise SpecConfigError(f"--speculative-config key {key!r} is not supported by the reference engine "
                                      f"(model-free methods {', '.join(METHODS)}; keys: {', '.join(sorted(known))})")
        method = d.get("method")
        if method not in METHODS:
            raise SpecConfigError(f"--speculative-config method must be one of {', '.join(map(repr, METHODS))} on "
                                  f"the reference engine (model-free drafts), got {method!r}")
        kw: dict = {"method": method}
        for key in INT_KEYS:
            if key in d:
                v = d[key]
                if isinstance(v, bool) or not isinstance(v, int):
                    raise SpecConfigError(f"--speculative-config {key} must be an integer, got {v!r}")
                kw[key] = v
        for key in FLOAT_KEYS:
            if key in d:
                v = d[key]
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise SpecConfigError(f"--speculative-config {key} must be a number, got {v!r}")
                kw[key] = float(v)
        if "num_speculative_tokens" not in kw:
            kw["num_speculative_tokens"] = kw.get("suffix_decoding_max_tree_depth", 24) if method == "suffix" \
                else kw.get("prompt_lookup_max", 5)
        if "num_speculative_tokens_per_batch_size" in d:
            kw["num_speculative_tokens_per_batch_size"] = _schedule(d["num_speculative_tokens_per_batch_size"])
        cfg = cls(**kw)
        cfg.check()
        return cfg

    def check(self) -> None:
        def bad(key: str, rule: str) -> None:
            raise SpecConfigError(f"--speculative-config {key}={getattr(self, key)!r} must be {rule}")

        if self.num_speculative_tokens < 1:
            bad("num_speculative_tokens", ">= 1")
        if self.num_speculative_tokens > 64:
            bad("num_speculative_tokens", "<= 64")
        if self.suffix_decoding_max_tree_depth < 2:
            bad("suffix_decoding_max_tree_depth", ">= 2")
        if self.suffix_decoding_max_cached_requests < 0:
            bad("suffix_decoding_max_cached_requests", ">= 0")
        if self.suffix_decoding_corpus_tokens < 0:
            bad("suffix_decoding_corpus_tokens", ">= 0")
        if self.suffix_decoding_max_spec_factor < 0:
            bad("suffix_decoding_max_spec_factor", ">= 0")
        if not 0 <= self.suffix_decoding_min_token_prob <= 1:
            bad("suffix_decoding_min_token_prob", "in [0, 1]")
        if self.prompt_lookup_min < 1:
            bad("prompt_lookup_min", ">= 1")
        if self.prompt_lookup_max < self.prompt_lookup_min:
            bad("prompt_lookup_max", f">= prompt_lookup_min ({self.prompt_lookup_min})")

    def max_draft(self, batch_size: int) -> int:
        """The most drafted tokens per request this step with ``batch_size`` running requests (0: no drafting)."""
        for lo, hi, k in self.num_speculative_tokens_per_batch_size:
            if lo <= batch_size <= hi:
                return min(k, self.num_speculative_tokens)
        return 0

    def to_json(self) -> dict:
        """vLLM's keys as given to ``--speculative-config`` (the ones vLLM knows: for ``--engine vllm``)."""
        d = {"method": self.method, "num_speculative_tokens": self.num_speculative_tokens}
        if self.method == "ngram":
            d |= {"prompt_lookup_max": self.prompt_lookup_max, "prompt_lookup_min": self.prompt_lookup_min}
        else:
            d |= {k: getattr(self, k) for k in ("suffix_decoding_max_tree_depth", "suffix_decoding_max_cached_requests",
                                                "suffix_decoding_max_spec_factor", "suffix_decoding_min_token_prob")}
        return d


def _schedule(value) -> tuple[tuple[int, int, int], ...]:
    rows = []
    if not isinstance(value, list):
        raise SpecConfigError("--speculative-config num_speculative_tokens_per_batch_size must be a list of "
                              "[range_start, range_end, num_speculative_tokens]")
    for row in value:
        if (not isinstance(row, (list, tuple)) or len(row) != 3
                or any(isinstance(x, bool) or not isinstance(x, int) for x in row)):
            raise SpecConfigError(f"--speculative-config num_speculative_tokens_per_batch_size entry {row!r} must be "
                                  "[range_start, range_end, num_speculative_tokens] (integers)")
        lo, hi, k = row
        if lo < 1 or hi < lo or k < 0:
            raise SpecConfigError(f"--speculative-config num_speculative_tokens_per_batch_size entry {row!r}: needs "
                                  "1 <= range_start <= range_end and num_speculative_tokens >= 0")
        rows.append((lo, hi, k))
    return tuple(rows)
