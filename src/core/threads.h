// Thread count for compute: OpenMP loops and the BLAS use the same number, so several MPI ranks on
// one machine never oversubscribe its cores (SPEC §3).
#pragma once

namespace longtron {

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
/// Why: OpenBLAS (pthread build) runs GEMMs on its own threads; a spinning OpenMP worker takes a
/// core from it (2 cores: step MFU 0.52 with spinning, 0.83 passive, measured by bench_step).
void ensure_passive_omp_wait(char** argv);

}  // namespace longtron
