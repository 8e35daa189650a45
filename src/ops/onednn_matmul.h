// oneDNN's matmul primitive behind ops::gemm<float> and ops::gemm_bf16 (internal to ops/).
#pragma once
#include <cstdint>

namespace longtron::ops::detail {

/// Element type of the A and B operands; C is fp32 (bf16 in onednn_matmul_bf16_out).
enum class MatmulInput { kF32, kBF16 };

/// C[M,N] = alpha·op(A)·op(B) + beta·C (row-major, M, N, K > 0) through a matmul primitive created
/// on the first call with this (input type, shape, transposes, alpha, beta) and cached. A and B
/// point to float or to bf16 bits according to `input`. Throws longtron::Error when oneDNN has no
/// implementation for this CPU.
void onednn_matmul(MatmulInput input, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                   float alpha, const void* A, const void* B, float beta, float* C);

/// onednn_matmul of bf16 A and B with alpha = 1, beta = 0 and C in bf16: the kernel rounds
/// each fp32 result to bf16 as it stores it (ops.h, gemm_bf16_out16).
void onednn_matmul_bf16_out(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                            const uint16_t* A, const uint16_t* B, uint16_t* C);

}  // namespace longtron::ops::detail
