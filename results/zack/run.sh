#!/usr/bin/env bash
# Reproduces results/zack/ (run from the repository root after `make install`; ~3 h on 2 CPU cores).
# The corpus: modelkit build-corpus --output $C --chat-train 0 --chat-heldout 32 --max-answer-tokens 128
set -euxo pipefail
export OMP_NUM_THREADS=1
C=${C:-~/.cache/swiftserve/corpus/smollm2-v2}
O=${O:-~/.cache/swiftserve/zack}
M=.venv/bin/modelkit
SWEEP='{"zack": {"rate": [0.02, 0.05, 0.1, 0.2, 0.5], "mode": ["adaptive", "uniform"]}}'

# 1. calibrations (32K tokens of the corpus' training split; the served rate here only names a default)
$M zack-calibrate --model default --output $O/base-whitened --basis whitened --corpus $C --rate 0.1
$M zack-calibrate --model default --output $O/base-stacked --basis stacked --corpus $C --rate 0.1
$M zack-calibrate --model SmolLM2-135M-Instruct-SwiftKV --output $O/swiftkv-whitened --basis whitened --corpus $C --rate 0.1

# 2. quality sweeps through the compressed cache
$M eval --corpus $C --baseline default --model whitened=$O/base-whitened --kv-methods "$SWEEP" \
    --samples 32 --gen-prompts 16 --gen-tokens 48 --out results/zack/sweep_smollm2.json
$M eval --corpus $C --baseline default --model whitened=$O/base-whitened \
    --kv-methods '{"zack": {"rate": [0.01, 0.03, 0.04], "mode": ["adaptive", "uniform"]}}' \
    --samples 32 --gen-prompts 0 --no-tasks --out results/zack/sweep_smollm2_fine.json
$M eval --corpus $C --baseline default --model whitened=$O/base-whitened \
    --kv-methods '{"zack": {"rate": [0.02, 0.05, 0.1], "mode": ["adaptive", "uniform"]}}' \
    --join-docs --prefix 2048 --continuation 64 --samples 12 --gen-prompts 0 --no-tasks --out results/zack/sweep_long.json
$M eval --corpus $C --baseline default --model stacked=$O/base-stacked \
    --kv-methods '{"zack": {"rate": [0.02, 0.05, 0.1, 0.2, 0.5], "mode": "adaptive"}}' \
    --samples 32 --gen-prompts 0 --no-tasks --out results/zack/sweep_smollm2_stacked.json
$M eval --corpus $C --baseline SmolLM2-135M-Instruct-SwiftKV --model whitened=$O/swiftkv-whitened \
    --kv-methods '{"zack": {"rate": [0.02, 0.05, 0.1, 0.5], "mode": ["adaptive", "uniform"]}}' \
    --samples 16 --gen-prompts 8 --gen-tokens 48 --out results/zack/sweep_swiftkv.json

# 3. attention speed vs rate (SmolLM2 and Llama-3.1-8B head shapes), then the report
.venv/bin/python -m benchmarks kernel zack_attention --repeats 15 --threads 1 --out results/zack/speed.json
.venv/bin/python -m benchmarks kernel zack_attention --shape llama8b --repeats 9 --threads 1 --out results/zack/speed_llama8b.json
.venv/bin/python -m benchmarks report zack --sweep results/zack/sweep_smollm2.json results/zack/sweep_smollm2_fine.json \
    --stacked results/zack/sweep_smollm2_stacked.json --long results/zack/sweep_long.json \
    --swiftkv results/zack/sweep_swiftkv.json --speed results/zack/speed.json \
    --more-speed results/zack/speed_llama8b.json --out results/zack

# 4. the paper's measure (issue 32): rate at which task accuracy stays at 99% (binary search; README.md)
.venv/bin/python -m studies.zack_task_search --corpus $C --hi 0.25 --steps 4 --engine-arg kv_cache_memory_gb=1 \
    --out results/zack/task_search.json
$M eval --corpus $C --baseline default --model zack=SmolLM2-135M-Instruct-ZACK \
    --kv-methods '{"zack": {"rate": 0.0156, "mode": "adaptive"}}' --join-docs --prefix 2048 --continuation 64 \
    --samples 12 --gen-prompts 0 --metrics ppl --engine-arg kv_cache_memory_gb=1 --out results/zack/long_at_task_rate.json
.venv/bin/python -m studies.zack_task_search --corpus $C --hi 0.25 --steps 4 --modes adaptive --with '{"zipcache": {}}' \
    --engine-arg kv_cache_memory_gb=1 --out results/kv_methods/zack_zipcache_task_search.json
