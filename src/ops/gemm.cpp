// GEMM entry point: float through oneDNN's sgemm, double through OpenBLAS's dgemm (oneDNN has no
// double GEMM; double is used only by the finite-difference tests). bf16 lives in gemm_bf16.cpp.
#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>

#include "core/error.h"
#include "ops/ops.h"

namespace longtron::ops {

namespace {
void backend_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                  const float* B, float beta, float* C) {
  // dnnl_sgemm is row-major (oneDNN ≥ 1.0) and runs on the OpenMP threads of the caller.
  const dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A,
                                      ta ? M : K, B, tb ? K : N, beta, C, N);
  check(st == dnnl_success, "oneDNN sgemm failed (status {}) for M={} N={} K={}",
        static_cast<int>(st), M, N, K);
}
void backend_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha,
                  const double* A, const double* B, double beta, double* C) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
              K, alpha, A, ta ? M : K, B, tb ? K : N, beta, C, N);
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
  backend_gemm(trans_a, trans_b, M, N, K, alpha, A, B, beta, C);
}

template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*,
                          const float*, float, float*);
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*,
                           const double*, double, double*);

}  // namespace longtron::ops
