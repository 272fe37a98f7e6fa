#!/usr/bin/env bash
# Reproduces results/kv_methods/ (run from the repository root after `make install`).
# The corpus is the one of results/zack/ (see results/zack/run.sh). One thread per process:
# the figures were taken on a shared 2-core machine.
set -euxo pipefail
export OMP_NUM_THREADS=1
C=${C:-~/.cache/swiftserve/corpus/smollm2-v2}
CAL=${CAL:-~/.cache/swiftserve/kvm/zack-base}
M=.venv/bin/modelkit
O=results/kv_methods

# 0. ZACK calibration of SmolLM2 (whitened basis; ~32K tokens of the corpus sources' training split)
[ -f "$CAL/zack.json" ] || $M zack-calibrate --model default --output "$CAL" --basis whitened --rate 0.1

# 1. quality vs memory, SmolLM2, 256-token prefixes: each method alone (ppl through the cache,
#    greedy agreement, task suite), then the combinations (ppl through the cache; ZACK x ZipCache
#    at three ZACK rates). Kept small: the figures were taken on a heavily shared 2-core machine.
$M eval --corpus $C --baseline default --model default --engine-arg kv_cache_memory_gb=1.0 \
    --samples 12 --gen-prompts 4 --gen-tokens 32 \
    --kv-methods '[{"kcache": {"top_n": 64}}, {"zipcache": {"bits_lo": 2}}, {"eviction": {"budget": 128}}]' \
    --out $O/sweep_short_methods.json
$M eval --corpus $C --baseline default --model default --engine-arg kv_cache_memory_gb=1.0 \
    --samples 8 --gen-prompts 0 --metrics ppl \
    --kv-methods '[{"zack": {"calibration": "'$CAL'", "rate": 0.1}, "zipcache": {"bits_lo": 2}}, {"zack": {"calibration": "'$CAL'", "rate": 0.1}, "eviction": {"budget": 128}}, {"kcache": {"top_n": 64}, "eviction": {"budget": 128}}, {"zack": {"calibration": "'$CAL'", "rate": 0.1}, "kcache": {"top_n": 64}}, {"zack": {"calibration": "'$CAL'", "rate": [0.05, 0.2]}, "zipcache": {"bits_lo": 2}}]' \
    --out $O/sweep_short_combos.json

# 2. 2048-token prompts (joined held-out passages) and the needle-in-a-haystack probe at 2048 tokens
$M eval --corpus $C --baseline default --model default --engine-arg kv_cache_memory_gb=1.0 \
    --join-docs --prefix 2048 --continuation 32 --samples 2 --gen-prompts 0 --metrics ppl --needle 4 --needle-context 2048 \
    --kv-methods '[{"eviction": {"budget": 512}}, {"kcache": {"top_n": 64}}, {"zipcache": {"bits_lo": 2}}]' \
    --out $O/sweep_long.json

# 3. the distilled SwiftKV model (baseline: the same model, uncompressed)
$M eval --corpus $C --baseline SmolLM2-135M-Instruct-SwiftKV --model SmolLM2-135M-Instruct-SwiftKV \
    --engine-arg kv_cache_memory_gb=1.0 --samples 4 --gen-prompts 0 --metrics ppl \
    --kv-methods '[{"kcache": {"top_n": 64}}, {"zipcache": {"bits_lo": 2}}, {"eviction": {"budget": 128}}]' \
    --out $O/sweep_swiftkv.json

# 4. throughput under memory pressure: the same 128 MiB of device KV memory for every configuration
.venv/bin/python -m benchmarks engine kv_pressure --pool-mb 128 --requests 16 --prompt 512 --gen 32 --max-num-seqs 16 \
    --batched-tokens 256 --out $O/pressure.json \
    --methods '{"baseline": {}, "kcache": {"kcache": {"top_n": 64}}, "zipcache": {"zipcache": {}}, "eviction": {"eviction": {"budget": 128}}, "zack+zipcache": {"zack": {"calibration": "'$CAL'", "rate": 0.1}, "zipcache": {}}, "kcache+eviction": {"kcache": {"top_n": 64}, "eviction": {"budget": 128}}}'

# 5. tables, plot, summary.json
.venv/bin/python -m benchmarks report kv_methods --short $O/sweep_short_methods.json --short $O/sweep_short_combos.json --long $O/sweep_long.json \
    --swiftkv $O/sweep_swiftkv.json --pressure $O/pressure.json --out $O \
    --pick kcache= --pick zipcache= --pick eviction=eviction.budget=128 \
    --pick zack+zipcache=zack.rate=0.1 --pick zack+eviction=zack.rate=0.1,eviction.budget=128 \
    --pick zack+kcache=zack.rate=0.1 --pick kcache+eviction=eviction.budget=128

# ZACK x ZipCache by task accuracy (issue 32): binary search of the ZACK rate with ZipCache on (results/zack/README.md)
.venv/bin/python -m studies.zack_task_search --corpus ~/.cache/swiftserve/corpus/smollm2-v2 --hi 0.25 --steps 4 \
    --modes adaptive --with '{"zipcache": {}}' --engine-arg kv_cache_memory_gb=1 --out results/kv_methods/zack_zipcache_task_search.json
