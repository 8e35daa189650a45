// Thread count for compute: OpenMP loops and the BLAS use the same number, so several MPI ranks on
// one machine never oversubscribe its cores (docs/cluster.md).
#pragma once
#include <cstdint>

namespace longtron {

/// The least work (elements a loop touches) for which an elementwise loop or copy forks an OpenMP
/// team (`#pragma omp parallel for ... if (work > kParallelMinWork)`); below it the team's start
/// and barrier cost more than the loop saves, and the loop runs on the calling thread. Whether a
/// loop forks never changes its result (each element is computed by one thread either way).
inline constexpr int64_t kParallelMinWork = int64_t{1} << 15;  // 32768
/// The same bound for the loops that were given twice as much (reductions, gathers of embedding
/// rows, bf16 widening, key-row copies of ring attention).
inline constexpr int64_t kParallelMinWorkLarge = int64_t{1} << 16;  // 65536

/// Number of hardware threads of this machine (at least 1).
int hardware_threads();

/// Sets the threads of OpenMP regions (oneDNN's GEMMs too) and OpenBLAS (double GEMMs). `n` <= 0:
/// hardware_threads() / ranks_on_node, at least 1. Returns the number actually set.
int set_num_threads(int n, int ranks_on_node = 1);

/// The number last set by set_num_threads (hardware_threads() before any call).
int num_threads();

/// Makes idle OpenMP workers sleep rather than spin (OMP_WAIT_POLICY=passive) unless the user set
/// the policy. libgomp reads it only when it loads, so when it is unset this sets it and re-executes
/// the program with the same argv (before MPI or any thread starts); returns if exec fails.
/// Why (bench_train_step, small config, 2 threads, oneDNN on OpenMP, shared 2-core machine): 418–443
/// tokens/s passive against 202–216 active and 208–242 with libgomp's default (spin, then sleep).
void ensure_passive_omp_wait(char** argv);

}  // namespace longtron
