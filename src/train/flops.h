// The machine's fp32 matrix-multiply speed, the denominator of MFU (docs/training.md).
#pragma once
#include <cstdint>

namespace longtron::train {

/// FLOP/s of a square sgemm C = A·B of size n (2n³ FLOPs per call) through ops::gemm<float> with
/// the threads currently set (set_num_threads): one warm-up call, then the best of `repeats`
/// timed calls. Called once at start-up by the trainer (n = 2048, ~0.1–1 s on a few cores).
double measure_sgemm_flops(int64_t n = 2048, int repeats = 3);

}  // namespace longtron::train
