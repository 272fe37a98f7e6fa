"""Which SDPA kernel does a GQA prefill take on this machine's torch? (the issue's first finding)

    python -m studies.sdpa_gqa_check --out results/perf/profiles/sdpa_gqa.json

SmolLM2's attention shape (9 query heads, 3 KV heads, head_dim 64), one causal prefill of
``--tokens`` queries over as many keys, fp32. Times (medians) of: the default dispatch with
``enable_gqa=True`` (what ``refengine.attention`` calls), the same forced to the math
kernel, forced to the flash kernel, and K/V repeated to every query head (no GQA) on the
default dispatch; plus a chunk with a key prefix (boolean mask), as a cached-prefix or
chunked prefill sends. The ratios say whether GQA falls back to the math path.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from benchmarks.lib.records import median_ms, write_json


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    h, kvh, d, n = 9, 3, 64, a.tokens
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, h, n, d, generator=g)
    k, v = torch.randn(1, kvh, n, d, generator=g), torch.randn(1, kvh, n, d, generator=g)
    kr, vr = k.repeat_interleave(h // kvh, dim=1), v.repeat_interleave(h // kvh, dim=1)
    half = n // 2                                  # second half of the queries over all keys
    mask = torch.arange(n).unsqueeze(0) <= torch.arange(half, n).unsqueeze(1)

    def gqa(backend=None, qq=q, m=None):
        def run():
            if backend is None:
                return F.scaled_dot_product_attention(qq, k, v, attn_mask=m, is_causal=m is None, enable_gqa=True)
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qq, k, v, attn_mask=m, is_causal=m is None, enable_gqa=True)
        return run

    res = {"torch": torch.__version__, "threads": torch.get_num_threads(), "tokens": n,
           "default_gqa_ms": median_ms(gqa(), a.repeats),
           "math_gqa_ms": median_ms(gqa(SDPBackend.MATH), a.repeats),
           "flash_gqa_ms": median_ms(gqa(SDPBackend.FLASH_ATTENTION), a.repeats),
           "default_repeated_kv_ms": median_ms(lambda: F.scaled_dot_product_attention(q, kr, vr, is_causal=True),
                                               a.repeats),
           "default_gqa_masked_chunk_ms": median_ms(gqa(qq=q[:, :, half:], m=mask), a.repeats),
           "math_gqa_masked_chunk_ms": median_ms(gqa(SDPBackend.MATH, q[:, :, half:], mask), a.repeats)}
    res["default_vs_math"] = res["default_gqa_ms"] / res["math_gqa_ms"]
    res["default_vs_flash"] = res["default_gqa_ms"] / res["flash_gqa_ms"]
    res["masked_default_vs_math"] = res["default_gqa_masked_chunk_ms"] / res["math_gqa_masked_chunk_ms"]
    print(json.dumps(res, indent=1))
    if a.out:
        write_json(a.out, res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
