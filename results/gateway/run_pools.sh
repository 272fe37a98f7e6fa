#!/usr/bin/env bash
# Reproduces section 5 of results/gateway/README.md (several models behind one gateway), from the
# repository root after `make install`: real SmolLM2 workers (the original, its 13% and 50% SwiftKV
# variants), one command per figure; each writes its JSON and merges its key into summary.json.
# Run on an otherwise idle machine (the committed figures: /work/tools/alone, loads in the README);
# about 10 minutes on 2 cores.
set -euxo pipefail
PY=${PY:-.venv/bin/python}
OUT=results/gateway
# mixed_pool_wrong_model_pct, with the gateway before model-aware pools (commit 364d80c) side by side
$PY benchmarks/gateway/pools.py pools --requests 120 --compare-ref 364d80c --out $OUT/pools.json
# split_ratio_error_pct: 2,000 requests to a 90/10 alias
$PY benchmarks/gateway/pools.py split --requests 2000 --out $OUT/split.json
# shadow_gap_nats_per_token: 16 greedy chat questions per variant, each answer scored by the original
$PY benchmarks/gateway/pools.py shadow --prompts 16 --out $OUT/shadow.json
# shadow_overhead_client_ttft_ratio: a 90/10 canary at 0.3 req/s (128/16 tokens), rounds off, on, on, off,
# the gateway with --shadow-yield all (the bench's default, as swiftserve up sets it)
$PY benchmarks/gateway/pools.py overhead --dtype auto --requests 32 --rounds 2 --rate 0.3 --input-len 128 \
  --output-len 16 --weights 90 10 --out $OUT/overhead.json
