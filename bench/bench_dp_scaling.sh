#!/usr/bin/env bash
# Data parallel on one machine (docs/benchmarks.md): `mpirun -np 2` (2 ranks x 1 thread, dp2)
# against one process with 2 threads on configs/small.toml, the same global batch (2 rows of
# 2048 tokens a step), no validation or checkpoint. Each round runs the one process, then dp2 with
# each given binary, so every dp2 run is paired with the one-process run just before it (the
# machine's load drifts). tokens/s = Σ tokens ÷ Σ step_time_s over steps 3..STEPS (the trainer's
# own step clock, from its metrics file); prints each run, each pair's ratio and the load average.
# usage: bench/bench_dp_scaling.sh BUILD STEPS ROUNDS [DP2_BINARY ...]
#   (DP2_BINARY defaults to BUILD/longtron; give an older binary too for before/after pairs)
# Needs demo/data (scripts/demo.sh prepares it).
set -euo pipefail
build=${1:-build}
steps=${2:-8}
rounds=${3:-3}
shift $(( $# < 3 ? $# : 3 ))
dp2_bins=("$@")
[ ${#dp2_bins[@]} -gt 0 ] || dp2_bins=("$build/longtron")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
common=(--config configs/small.toml --set train.total_steps="$steps" --set train.valid_every=0
        --set train.save_every=0 --set train.checkpoint_dir="$out/ckpt" --overwrite)

# tokens/s of a metrics file over steps 3 onwards.
rate() {
  awk '/"loss"/ {
         match($0, /"step":[0-9]+/); s = substr($0, RSTART + 7, RLENGTH - 7) + 0;
         match($0, /"tokens":[0-9]+/); t = substr($0, RSTART + 9, RLENGTH - 9) + 0;
         match($0, /"step_time_s":[0-9.eE+-]+/); d = substr($0, RSTART + 14, RLENGTH - 14) + 0;
         if (s >= 3) { T += t; D += d } }
       END { if (D > 0) printf "%.1f", T / D; else print "nan" }' "$1"
}

for round in $(seq 1 "$rounds"); do
  load=$(cut -d' ' -f1 /proc/loadavg)
  "$build/longtron" train "${common[@]}" --set data.micro_num=2 --set train.num_threads=2 \
    --set train.metrics_file="$out/one.jsonl" > "$out/one.log" 2>&1
  one=$(rate "$out/one.jsonl")
  line="round $round (load $load): one process ${one} tok/s"
  for i in "${!dp2_bins[@]}"; do
    mpirun --allow-run-as-root --oversubscribe -np 2 "${dp2_bins[$i]}" train "${common[@]}" \
      --set data.micro_num=1 --set train.metrics_file="$out/dp2.jsonl" > "$out/dp2.log" 2>&1
    dp2=$(rate "$out/dp2.jsonl")
    sent=$(grep -o 'sent_mb [0-9.]*' "$out/dp2.log" | tail -1 || true)
    line+="; dp2[$i] ${dp2} tok/s, ratio $(awk -v a="$dp2" -v b="$one" 'BEGIN { printf "%.3f", a / b }')${sent:+ ($sent)}"
  done
  echo "$line"
done
