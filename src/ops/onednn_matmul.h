// oneDNN's matmul primitive behind ops::gemm<float> and ops::gemm_bf16 (internal to ops/).
#pragma once
#include <cstdint>

namespace longtron::ops::detail {

/// Element type of the A and B operands; C is always fp32.
enum class MatmulInput { kF32, kBF16 };

/// C[M,N] = alpha·op(A)·op(B) + beta·C (row-major, M, N, K > 0) through a matmul primitive created
/// on the first call with this (input type, shape, transposes, alpha, beta) and cached. A and B
/// point to float or to bf16 bits according to `input`. Throws longtron::Error when oneDNN has no
/// implementation for this CPU.
void onednn_matmul(MatmulInput input, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                   float alpha, const void* A, const void* B, float beta, float* C);

}  // namespace longtron::ops::detail
