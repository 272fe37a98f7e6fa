#!/usr/bin/env bash
# benchmarks/kernel/attention.py before (c9baf8a) and after (this branch), interleaved, 3 rounds.
# The earlier sources: git archive c9baf8a | tar -x -C /tmp/base_src (built into its own extension dir).
set -e
REPO=$(pwd)
.venv/bin/python -m refengine.paged_kernel
uptime
for r in 1 2 3; do
  (cd /tmp/base_src && TORCH_EXTENSIONS_DIR=/tmp/ext_base "$REPO"/.venv/bin/python -m benchmarks kernel attention \
      --repeats 20 --out "$REPO"/results/models/attention_kernels_ab/ab_base_$r.json > /dev/null)
  .venv/bin/python -m benchmarks kernel attention --repeats 20 --out results/models/attention_kernels_ab/ab_ours_$r.json > /dev/null
  echo round $r
done
uptime
