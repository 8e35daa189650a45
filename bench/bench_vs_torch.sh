#!/usr/bin/env bash
# configs/small.toml training step, longtron float32 and bfloat16 (bench_train_step) against
# PyTorch eager fp32 and torch.autocast bf16 (bench/torch_step.py) on the same model shape and a
# packed row of the same length and document-length distribution, with the same thread count, in
# one run; prints tokens/s and the ratios (docs/benchmarks.md).
# PyTorch runs with OMP_WAIT_POLICY=passive, the policy longtron sets for itself (ops/threads.h):
# with libgomp's default spinning, PyTorch's many small parallel ops ran 5-10x slower on a loaded
# machine. Needs Debian's python3-torch (apt-get install python3-torch); a benchmark, never a test.
# Usage: bench/bench_vs_torch.sh [BUILD_DIR] [STEPS] [THREADS]   (THREADS: default all cores)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${1:-build}"
STEPS="${2:-6}"
THREADS="${3:-$(nproc)}"
CONFIG="$(mktemp --suffix=.toml)"
trap 'rm -f "$CONFIG"' EXIT
# configs/small.toml with train.num_threads = THREADS ([train] is its last table).
sed "/^\[train\]/a num_threads = $THREADS" configs/small.toml > "$CONFIG"
declare -A tps
for dtype in float32 bfloat16; do
  # "P rss_mib median_step_s median_tgs median_mfu gemm_gflops"
  line="$("$BUILD/bench_train_step" --child 4 "$STEPS" "$CONFIG" "$dtype" 2>/dev/null | tail -1)"
  read -r P rss step tgs mfu gemm <<< "$line"
  tps[longtron_$dtype]="$tgs"
  echo "longtron $dtype ($THREADS threads): P = $P, median step $step s, $tgs tokens/s, MFU $mfu (GEMM $gemm GFLOP/s), peak RSS $rss MiB"
done
while read -r line; do
  echo "$line"
  if [[ "$line" =~ ^torch\ (float32|bfloat16):.*\ ([0-9]+)\ tokens/s ]]; then
    tps[torch_${BASH_REMATCH[1]}]="${BASH_REMATCH[2]}"
  fi
done < <(OMP_WAIT_POLICY=passive /usr/bin/python3 bench/torch_step.py --threads "$THREADS" --steps "$STEPS" --P 2048)
awk -v lf="${tps[longtron_float32]}" -v lb="${tps[longtron_bfloat16]}" \
    -v tf="${tps[torch_float32]:-0}" -v tb="${tps[torch_bfloat16]:-0}" 'BEGIN {
  printf "longtron bf16 / longtron fp32: %.2f\n", lb / lf
  if (tb > 0) printf "longtron bf16 / torch bf16 autocast: %.2f\n", lb / tb
  if (tf > 0) printf "longtron fp32 / torch fp32: %.2f\n", lf / tf
}'
