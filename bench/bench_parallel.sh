#!/usr/bin/env bash
# Runs bench_parallel once per layout (peak RSS is per process, so one layout per mpirun job) on
# configs/small.toml's model, then the dp Σlᵢ² spread. Usage: bench/bench_parallel.sh [BUILD_DIR]
set -euo pipefail
build=${1:-build}
run() { OMP_NUM_THREADS=1 mpirun -np 2 --oversubscribe --allow-run-as-root --bind-to none \
          "$build/bench_parallel" "$@" --steps "${STEPS:-3}"; }
run --tp 1 --mode mtp              # dp2, one replica per rank
run --tp 1 --mode mtp --zero1 -1   # dp2 + ZeRO-1
for mode in mtp msp fsp; do run --tp 2 --mode "$mode"; done
"$build/bench_parallel" --sum-l2 --dp 2,4,8 --steps 50
