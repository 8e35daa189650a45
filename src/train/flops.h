// The machine's matrix-multiply speed, the denominator of MFU (docs/training.md): model FLOPs ÷ step
// time ÷ the GEMM FLOP/s of the dtype in use, measured once at start-up.
#pragma once
#include <cstdint>
#include <functional>

#include "ops/precision.h"

namespace longtron::train {

/// FLOP/s of a square fp32 GEMM C = A·B of size n (2n³ FLOPs per call) through ops::gemm<float>
/// (oneDNN) with the threads currently set (set_num_threads): one warm-up call, then the best of
/// `repeats` timed calls. Called once at start-up by the trainer (n = 2048, ~0.1–1 s on a few cores).
double measure_sgemm_flops(int64_t n = 2048, int repeats = 3);

/// The same for bf16 × bf16 → fp32 through ops::gemm_bf16; 0 when oneDNN has no bf16 matmul on
/// this CPU.
double measure_gemm_bf16_flops(int64_t n = 2048, int repeats = 3);

/// A step's MFU: `flops_per_s` (model FLOPs per second of one rank) ÷ `gemm_flops`. Above 1 the
/// GEMM rate measured at start-up was low (the CPU in a slow patch of a shared machine): `retime`
/// measures it again, at most `retimes_left` times over the run, and gemm_flops keeps the faster.
double step_mfu(double flops_per_s, double& gemm_flops, int& retimes_left,
                const std::function<double()>& retime);

/// measure_gemm_bf16_flops under kBFloat16, else measure_sgemm_flops: the GEMM rate of `compute`.
double measure_gemm_flops(ops::ComputeType compute, int64_t n = 2048);

}  // namespace longtron::train
