#!/usr/bin/env bash
# A training step, longtron (bench_train_step) against PyTorch eager (bench/torch_step.py) on the
# same model shape and packed rows of the same length and document-length law (a fresh row each
# step in both), with the same thread count, in one run; prints tokens/s and the ratios
# (docs/benchmarks.md).
#   small: configs/small.toml, P = 2048, documents of mean 300; longtron fp32 and bf16 against
#          PyTorch fp32 and torch.autocast bf16.
#   long:  bench/long_row.toml, P = 16384, documents of mean 2048, hidden 512, 4 heads of 128,
#          2 kv heads, 4 layers; bf16 only (PyTorch materialises each document's score matrix).
# PyTorch runs with OMP_WAIT_POLICY=passive, the policy longtron sets for itself (ops/threads.h):
# with libgomp's default spinning, PyTorch's many small parallel ops ran 5-10x slower on a loaded
# machine. Needs Debian's python3-torch (apt-get install python3-torch); a benchmark, never a test.
# PROFILE=1 adds one profiled PyTorch step per dtype after the timed ones and prints the share of
# it spent in GEMMs (the part an engine calling the same GEMM library cannot make faster).
# Usage: [ROUNDS=N] [LAYERS=L] [PROFILE=1] bench/bench_vs_torch.sh [BUILD_DIR] [STEPS] [THREADS] [small|long]
#        (THREADS: default all cores; the long row needs ~10 GB for PyTorch)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${1:-build}"
STEPS="${2:-6}"
THREADS="${3:-$(nproc)}"
MODE="${4:-small}"
case "$MODE" in
  small) BASE=configs/small.toml; MEAN=300; DTYPES=(float32 bfloat16)
         TORCH_ARGS=(--P 2048 --mean 300 --dtypes float32,bfloat16) ;;
  long)  BASE=bench/long_row.toml; MEAN=2048; DTYPES=(bfloat16)
         TORCH_ARGS=(--P 16384 --mean 2048 --dtypes bfloat16 --hidden 512 --layers 4 --heads 4
                     --kv-heads 2) ;;
  *) echo "mode must be small or long, not $MODE" >&2; exit 2 ;;
esac
CONFIG="$(mktemp --suffix=.toml)"
trap 'rm -f "$CONFIG"' EXIT
# The config with train.num_threads = THREADS ([train] is its last table), and LAYERS layers when
# set (in both engines: a quicker proxy on a busy machine, since the ratio is mostly per layer).
sed "/^\[train\]/a num_threads = $THREADS" "$BASE" > "$CONFIG"
if [ -n "${LAYERS:-}" ]; then
  sed -i "s/^num_layers = .*/num_layers = $LAYERS/" "$CONFIG"
  TORCH_ARGS+=(--layers "$LAYERS")
fi
# ROUNDS > 1 repeats the whole comparison (longtron then PyTorch) and prints each round's ratios:
# on a shared machine the two engines run at different moments, so one round's ratio is noisy.
for round in $(seq "${ROUNDS:-1}"); do
  declare -A tps=() tpc=()
  for dtype in "${DTYPES[@]}"; do
    # "P rss_mib median_step_s median_tgs median_mfu gemm_gflops plan_mib cpu_s_per_step"
    line="$("$BUILD/bench_train_step" --child 4 "$STEPS" "$CONFIG" "$dtype" "$MEAN" 2>/dev/null | tail -1)"
    read -r P rss step tgs mfu gemm plan cpu <<< "$line"
    tps[longtron_$dtype]="$tgs"
    tpc[longtron_$dtype]="$(awk -v p="$P" -v c="$cpu" 'BEGIN { printf "%.0f", p / c }')"
    echo "longtron $dtype ($THREADS threads): P = $P, median step $step s, $tgs tokens/s, ${tpc[longtron_$dtype]} tokens per CPU-second (start-up included), MFU $mfu (GEMM $gemm GFLOP/s), peak RSS $rss MiB"
  done
  while read -r line; do
    echo "$line"
    if [[ "$line" =~ ^torch\ (float32|bfloat16):.*\ ([0-9]+)\ tokens/s.*\ ([0-9]+)\ tokens\ per\ CPU ]]; then
      tps[torch_${BASH_REMATCH[1]}]="${BASH_REMATCH[2]}"
      tpc[torch_${BASH_REMATCH[1]}]="${BASH_REMATCH[3]}"
    fi
  done < <(OMP_WAIT_POLICY=passive /usr/bin/python3 bench/torch_step.py --threads "$THREADS" \
             --steps "$STEPS" "${TORCH_ARGS[@]}" ${PROFILE:+--profile})
  # Ratios of wall-clock tokens/s and of tokens per CPU-second (the latter is what a shared machine
  # disturbs least; it credits PyTorch's idle threads, so it understates longtron's parallel gain).
  awk -v lf="${tps[longtron_float32]:-0}" -v lb="${tps[longtron_bfloat16]:-0}" \
      -v tf="${tps[torch_float32]:-0}" -v tb="${tps[torch_bfloat16]:-0}" \
      -v clf="${tpc[longtron_float32]:-0}" -v clb="${tpc[longtron_bfloat16]:-0}" \
      -v ctf="${tpc[torch_float32]:-0}" -v ctb="${tpc[torch_bfloat16]:-0}" \
      -v mode="$MODE" -v round="$round" 'BEGIN {
    if (lf > 0) printf "%s round %d: longtron bf16 / longtron fp32: %.2f\n", mode, round, lb / lf
    if (tb > 0) printf "%s round %d: longtron bf16 / torch bf16 autocast: %.2f wall, %.2f per CPU-second\n", mode, round, lb / tb, (ctb > 0 ? clb / ctb : 0)
    if (tf > 0 && lf > 0) printf "%s round %d: longtron fp32 / torch fp32: %.2f wall, %.2f per CPU-second\n", mode, round, lf / tf, (ctf > 0 ? clf / ctf : 0)
  }'
done
