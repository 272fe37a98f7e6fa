#!/bin/bash
# l=27 (10% SwiftKV: prefill skips 3 of 30 layers) on CPU, as run for the shipped tensors (issue 18): a
# least-squares K/V start fitted on 64 windows (32K tokens), then 80 distillation steps of 2 x 512-token
# windows (82K tokens, one epoch of 160 windows) on the idle 2-core machine in 9 minutes.
cd "$(dirname "$0")/../../.."   # the repository root
exec env OMP_NUM_THREADS=2 .venv/bin/modelkit distill --corpus ~/.cache/swiftserve/corpus/smollm2-v2 \
  -l 27 --groups 1 --output runs/l27 --init lstsq --init-windows 64 --steps 80 --micro-batch 2 --grad-accum 1 \
  --lr 3e-4 --min-lr-ratio 0.1 --warmup 0.03 --dtype float32 --no-compile --eval-every 40 --eval-windows 8 \
  --save-every 10 --threads 2 --cache runs/l27-cache --train-windows 160 --max-hours 0.3
