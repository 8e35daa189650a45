// GEMM through the BLAS (OpenBLAS): the one place the kernels call cblas.
#include <cblas.h>

#include "ops/ops.h"

namespace longtron::ops {

namespace {
void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K, float alpha,
               const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C) {
  cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, N);
}
void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K,
               double alpha, const double* A, int64_t lda, const double* B, int64_t ldb,
               double beta, double* C) {
  cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, N);
}
}  // namespace

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          const T* B, T beta, T* C) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // BLAS leaves C untouched when K = 0 only for beta = 1; make it explicit.
    for (int64_t i = 0; i < M * N; ++i) C[i] = beta == T(0) ? T(0) : beta * C[i];
    return;
  }
  blas_gemm(trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K,
            alpha, A, trans_a ? M : K, B, trans_b ? K : N, beta, C);
}

template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*,
                          const float*, float, float*);
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*,
                           const double*, double, double*);

}  // namespace longtron::ops
