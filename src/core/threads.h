// Thread count for compute: OpenMP loops and the BLAS use the same number, so several MPI ranks on
// one machine never oversubscribe its cores (SPEC §3).
#pragma once

namespace longtron {

/// Number of hardware threads of this machine (at least 1).
int hardware_threads();

/// Sets the threads used by OpenMP regions and by the BLAS. `n` <= 0 means
/// hardware_threads() / ranks_on_node, at least 1. Returns the number actually set.
int set_num_threads(int n, int ranks_on_node = 1);

/// The number last set by set_num_threads (hardware_threads() before any call).
int num_threads();

}  // namespace longtron
