#!/usr/bin/env bash
# Reproduces results/gateway/ (run from the repository root after `make install`).
# Everything runs on this machine's loopback: stub workers, gateways and the load client
# share its cores, so run it on an otherwise idle machine, or read the figures as relative.
set -euxo pipefail
PY=.venv/bin/python
OUT=results/gateway
# The gateway as it was before issue 17 (the merge base with main), measured side by side.
BASE=${BASE:-5710046}
BEFORE=$(mktemp -d)
trap 'rm -rf "$BEFORE"' EXIT
git archive "$BASE" gateway swiftserve | tar -x -C "$BEFORE"

# 1. overhead (16 clients and 1 client, direct / gateway / gateway before) and JSQ vs round-robin
$PY benchmarks/gateway/routing.py --compare-tree "$BEFORE" --out $OUT/bench.json
# 2. where the proxy path spends its CPU (py-spy), CPU per request of client, gateway, worker
$PY benchmarks/gateway/profile.py --out $OUT/profile.md
# 3. prefix-aware vs JSQ on the shared-prefix workload; then with one hot prefix
$PY benchmarks/gateway/prefix.py --out $OUT/prefix.json
$PY benchmarks/gateway/prefix.py --hot-share 0.5 --out $OUT/prefix_hot.json
# 4. summary.json from bench.json and prefix.json
$PY benchmarks/report/gateway.py $OUT
