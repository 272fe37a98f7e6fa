#!/usr/bin/env bash
# Baseline SmolLM2 vs distilled SwiftKV (and AcrossKV) behind the gateway with two workers:
# a prompt-heavy open-loop sweep per model, then one comparison report (table + plots + HTML).
#
#   bash loadtest/recipes/swiftkv_vs_baseline.sh [OUT_DIR]
#
# Knobs (environment of this script only): RATES, NUM_REQUESTS, INPUT_LEN, OUTPUT_LEN, STOP_TTFT_MS,
# MODELS ("label=model ..."), PORT. Every stack is started with `swiftserve up` and stopped after its sweep,
# so the models are measured one after the other on the same machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-results/loadtest/swiftkv_vs_baseline}
RATES=${RATES:-"0.1 0.2 0.3 0.4 0.6"}
NUM_REQUESTS=${NUM_REQUESTS:-24}
INPUT_LEN=${INPUT_LEN:-1000}
OUTPUT_LEN=${OUTPUT_LEN:-32}
STOP_TTFT_MS=${STOP_TTFT_MS:-30000}
PORT=${PORT:-8700}
MODELS=${MODELS:-"baseline=default swiftkv=SmolLM2-135M-Instruct-SwiftKV acrosskv=SmolLM2-135M-Instruct-SwiftKV-AcrossKV2"}
PY=${PY:-.venv/bin/python}
mkdir -p "$OUT"

for spec in $MODELS; do
  label=${spec%%=*}; model=${spec#*=}
  log="$OUT/$label-stack.log"
  "$PY" -m swiftserve up --model "$model" --served-model-name smollm2 --workers 2 --port "$PORT" \
      --worker-base-port $((PORT + 1)) > "$log" 2>&1 &
  stack=$!
  trap 'kill $stack 2>/dev/null || true' EXIT
  for _ in $(seq 1 300); do grep -q "Gateway ready" "$log" && break; sleep 1; done
  grep -q "Gateway ready" "$log" || { echo "stack for $label did not start; see $log"; exit 1; }
  # shellcheck disable=SC2086
  "$PY" -m loadtest sweep --base-url "http://127.0.0.1:$PORT" --label "$label" --rates $RATES \
      --num-requests "$NUM_REQUESTS" --input-len "$INPUT_LEN" --output-len "$OUTPUT_LEN" \
      --slo-ttft-ms 10000 --slo-tpot-ms 500 --stop-ttft-ms "$STOP_TTFT_MS" --result-dir "$OUT/runs"
  kill "$stack"; wait "$stack" 2>/dev/null || true
  trap - EXIT
done
"$PY" -m loadtest compare "$OUT/runs" --out "$OUT"
