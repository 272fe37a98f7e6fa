#!/bin/bash
# l=22 (25% SwiftKV) on CPU, as run for the shipped tensors (issue 18). It was stopped after the
# least-squares start (init-l22-g1.safetensors, shipped as swiftkv-l22-g1.safetensors): the shared
# 2-core machine (load 14-30) (ps: 6-8% CPU for it), 23 min for the fit on 8 windows; no gradient steps.
cd "$(dirname "$0")/../../.."   # the repository root
exec env OMP_NUM_THREADS=2 nice -n 19 .venv/bin/modelkit distill --corpus /root/.cache/swiftserve/corpus/smollm2-v2 \
  -l 22 --groups 1 --output runs/l22 --init lstsq --init-windows 16 --steps 8 --micro-batch 2 --grad-accum 1 \
  --lr 3e-4 --min-lr-ratio 0.1 --warmup 0.03 --dtype float32 --no-compile --eval-every 8 --eval-windows 2 \
  --save-every 1 --threads 2 --cache runs/l22-cache --train-windows 8
