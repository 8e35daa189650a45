#!/usr/bin/env bash
# data.balance in time (docs/balance.md, docs/benchmarks.md), in one run:
#  1. dp2 under mpirun (2 ranks × 1 thread), the long-row model (bench/long_row.toml: P = 16384,
#     hidden 512, 4 heads of 128, 2 kv heads, 4 layers) with micro_num 4, on random documents of
#     exponential lengths (mean 2048, or MEAN): the step time of data.balance = none, rows and documents over
#     the same steps of the same data, the modes interleaved round by round; prints each mode's
#     median step time (first step left out), the modelled imbalance, and the ratios to "none".
#  2. If the demo corpus is prepared (demo/data, scripts/demo.sh; or DEMO_DATA=DIR), the demo
#     (configs/demo.toml, 100 steps) with data.balance = "documents" and "none" for each seed in
#     SEEDS (train.seed = data.seed): the held-out loss after the same number of tokens.
# Usage: bench/bench_balance_time.sh [BUILD_DIR] [STEPS] [ROUNDS]
#        (defaults: build, 3 steps, 1 round; LAYERS=L overrides the long-row model's 4 layers for a
#        quicker proxy on a busy machine; MEAN=M the documents' mean length (longer documents
#        leave the ranks' attention sums further apart); SEEDS="1 2", DEMO_THREADS=1 (per run; the two runs
#        of a seed go side by side), SKIP_TIME=1 or
#        SKIP_DEMO=1 to run one part only)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="$(realpath "${1:-build}")"
STEPS="${2:-3}"
ROUNDS="${3:-1}"
SEEDS="${SEEDS:-1 2}"
DEMO_DATA="${DEMO_DATA:-demo/data}"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

# Median step time (steps after the first), mean imbalance and last valid loss of a metrics file.
summary() {
  /usr/bin/python3 - "$1" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
train = [r for r in rows if "step_time_s" in r]
times = sorted(r["step_time_s"] for r in train[1:] or train)
imb = [r.get("imbalance", 1.0) for r in train]
valid = [r for r in rows if "valid_loss" in r]
print(f"{times[len(times) // 2]:.3f} {sum(imb) / len(imb):.3f} "
      f"{valid[-1]['valid_loss'] if valid else float('nan'):.4f} {train[-1]['step']}")
PY
}

if [ "${SKIP_TIME:-0}" != 1 ]; then
  # Enough documents for every step of the largest balance window (8 steps × 8 rows × 16384).
  "$BUILD/bench_train_step" --write-dataset "$TMP/data" 8192 $(( (STEPS + 8) * 8 * 16384 )) "${MEAN:-2048}"
  declare -A times last
  for round in $(seq "$ROUNDS"); do
    for mode in none rows documents; do
      OMP_NUM_THREADS=1 mpirun -np 2 --oversubscribe --allow-run-as-root --bind-to none \
        "$BUILD/longtron" train --config bench/long_row.toml --overwrite \
        --set "data.train_folder=\"$TMP/data\"" --set data.micro_num=4 \
        --set "data.balance=\"$mode\"" --set train.total_steps="$STEPS" \
        --set train.num_threads=1 --set model.dtype='"bfloat16"' ${LAYERS:+--set model.num_layers=$LAYERS} \
        --set "train.checkpoint_dir=\"$TMP/ckpt\"" \
        --set "train.metrics_file=\"$TMP/$mode.jsonl\"" > "$TMP/$mode.log" 2>&1 \
        || { cat "$TMP/$mode.log" >&2; exit 1; }
      read -r step imb _ _ <<< "$(summary "$TMP/$mode.jsonl")"
      times[$mode]="${times[$mode]:-} $step"
      last[$mode]="$step"
      echo "round $round: data.balance = $mode: median step $step s, mean modelled imbalance $imb"
    done
    awk -v none="${last[none]}" -v rows="${last[rows]}" -v docs="${last[documents]}" 'BEGIN {
      printf "round: step time rows / none %.3f, documents / none %.3f\n", rows / none, docs / none }'
  done
  for mode in none rows documents; do echo "step times ($mode):${times[$mode]}"; done
fi

if [ "${SKIP_DEMO:-0}" != 1 ] && [ -f "$DEMO_DATA/dataset.json" ]; then
  for seed in $SEEDS; do
    for mode in none documents; do  # the two runs side by side: only their losses are compared
      "$BUILD/longtron" train --config configs/demo.toml --overwrite \
        --set "data.train_folder=\"$DEMO_DATA/train\"" --set "data.valid_folder=\"$DEMO_DATA/valid\"" \
        --set "data.balance=\"$mode\"" --set train.seed="$seed" --set data.seed="$seed" \
        --set train.num_threads="${DEMO_THREADS:-1}" \
        --set "train.checkpoint_dir=\"$TMP/demo_ckpt_$mode\"" \
        --set "train.metrics_file=\"$TMP/demo_$mode.jsonl\"" > "$TMP/demo_$mode.log" 2>&1 &
    done
    wait || true
    for mode in none documents; do
      [ -s "$TMP/demo_$mode.jsonl" ] || { cat "$TMP/demo_$mode.log" >&2; exit 1; }
      read -r _ imb loss steps <<< "$(summary "$TMP/demo_$mode.jsonl")"
      echo "demo seed $seed, data.balance = $mode: held-out loss $loss after $steps steps (mean modelled imbalance $imb)"
    done
  done
fi
