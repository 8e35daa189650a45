// GEMM entry point: float through oneDNN's matmul primitive, double through OpenBLAS's dgemm
// (oneDNN has no double GEMM; double serves the finite-difference tests). bf16: onednn_matmul.cpp.
#include <cblas.h>
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <bit>
#include <memory>
#include <span>
#include <vector>

#include "core/bf16.h"
#include "core/grow_buffer.h"
#include "ops/compute_context.h"
#include "ops/cpu_features.h"
#include "ops/onednn_matmul.h"
#include "ops/ops.h"
#include "ops/threads.h"

namespace longtron::ops {

namespace {
// out[i] = the rounding of x[i]; with kWiden also wide[i] = its value (wide may be x).
template <bool kWiden = false>
void round_scalar(const float* x, int64_t n, uint16_t* out, float* wide = nullptr) {
  for (int64_t i = 0; i < n; ++i) {
    out[i] = float_to_bf16(x[i]);
    if constexpr (kWiden) wide[i] = bf16_to_float(out[i]);
  }
}

// float_to_bf16's rule on 16 values per step in AVX-512F integer arithmetic (chosen at run time,
// so a build without -march=native still uses it). Not VCVTNE2PS2BF16: that instruction flushes
// subnormals, and the rounding must not depend on the CPU.
// GCC 12 warns (-Wmaybe-uninitialized) inside its own _mm512_srli_epi32/_mm512_cvtepi32_epi16,
// whose pass-through operand is _mm512_undefined_epi32() (GCC bug 105593, fixed in GCC 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
template <bool kWiden = false>
__attribute__((target("avx512f"))) void round_avx512(const float* x, int64_t n, uint16_t* out,
                                                     float* wide = nullptr) {
  const __m512i half_ulp = _mm512_set1_epi32(0x7FFF), one = _mm512_set1_epi32(1),
                magnitude = _mm512_set1_epi32(0x7FFFFFFF), inf = _mm512_set1_epi32(0x7F800000),
                quiet = _mm512_set1_epi32(0x00400000);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i u = _mm512_loadu_si512(x + i);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(half_ulp, odd));
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, magnitude), inf);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(u, quiet));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
    if constexpr (kWiden)
      _mm512_storeu_si512(wide + i, _mm512_and_si512(r, _mm512_set1_epi32(int(0xFFFF0000u))));
  }
  round_scalar<kWiden>(x + i, n - i, out + i, kWiden ? wide + i : nullptr);
}
#pragma GCC diagnostic pop

/// Rounds every job in one parallel region (one fork and barrier for all of a GEMM's operands: on
/// small GEMMs the threads' synchronisation costs more than the rounding).
void round_jobs(std::span<const Bf16Rounding> jobs) {
  const auto round = cpu_has("avx512f") ? round_avx512<> : round_scalar<>;
  constexpr int64_t kChunk = int64_t{1} << 16;
  int64_t chunks = 0;
  for (const Bf16Rounding& j : jobs) chunks += (j.n + kChunk - 1) / kChunk;
  if (chunks <= 1) {
    for (const Bf16Rounding& j : jobs) round(j.x, j.n, j.out, nullptr);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    int64_t k = c;  // the chunk's job and its index there
    size_t j = 0;
    for (; k >= (jobs[j].n + kChunk - 1) / kChunk; ++j) k -= (jobs[j].n + kChunk - 1) / kChunk;
    const int64_t begin = k * kChunk;
    round(jobs[j].x + begin, std::min(kChunk, jobs[j].n - begin), jobs[j].out + begin, nullptr);
  }
}

void round_pair(const float* x, int64_t nx, uint16_t* ox, const float* y, int64_t ny,
                uint16_t* oy) {
  const Bf16Rounding jobs[] = {{x, nx, ox}, {y, ny, oy}};
  round_jobs(jobs);
}

// The per-thread buffer rounded GEMM operands live in, reused from call to call (shared by
// mixed_precision_gemm and gemm_bf16_weight: the memory plan counts one).
// Grown uninitialised: every element is rounded into before it is read.
GrowBuffer<uint16_t>& operand_buffer() {
  thread_local GrowBuffer<uint16_t> buffer;
  return buffer;
}

// The bf16 bits x[0..n) already has: a weight's from the context's copy, or an activation's
// that the caller shares (SharedRoundings); nullptr when x must be rounded.
const uint16_t* known_bits(const ComputeContext& cc, const float* x, int64_t n) {
  const uint16_t* bits = cc.weights().of(x, n);
  return bits != nullptr ? bits : cc.shared().of(x, n);
}

// Mixed precision (torch.autocast's rule for matmuls): both operands rounded to bf16, the product
// accumulated in fp32. Weights come from the context's bf16 copy (ComputeContext::weights) and
// shared activations from their bits (ComputeContext::shared); other operands are rounded into
// one per-thread buffer (A's copy, then B's), reused from call to call and reallocated without
// copying when a call needs more, so it holds the largest pair of operands one call rounds (a
// weight gradient's dy and x), not the largest A plus the largest B.
void mixed_precision_gemm(const ComputeContext& cc, bool ta, bool tb, int64_t M, int64_t N,
                          int64_t K, float alpha, const float* A, const float* B, float beta,
                          float* C) {
  GrowBuffer<uint16_t>& buffer = operand_buffer();
  const uint16_t* a = known_bits(cc, A, M * K);
  const uint16_t* b = known_bits(cc, B, K * N);
  const int64_t na = a ? 0 : M * K, nb = b ? 0 : K * N;
  uint16_t* const a16 = buffer.get(na + nb);
  uint16_t* const b16 = a16 + na;
  round_pair(A, na, a16, B, nb, b16);
  detail::onednn_matmul(detail::MatmulInput::kBF16, ta, tb, M, N, K, alpha, a ? a : a16,
                        b ? b : b16, beta, C);
}

void backend_gemm(const ComputeContext& cc, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                  float alpha, const float* A, const float* B, float beta, float* C) {
  if (cc.bf16()) return mixed_precision_gemm(cc, ta, tb, M, N, K, alpha, A, B, beta, C);
  // The matmul primitive rather than dnnl_sgemm: on the shapes of a training step it was faster in
  // aggregate (bench_gemm), and dnnl_sgemm collapsed on some backward shapes at 2 threads (e.g.
  // 384×1024×2048 with A transposed: 4–7 GFLOP/s against 17–20 for the matmul).
  detail::onednn_matmul(detail::MatmulInput::kF32, ta, tb, M, N, K, alpha, A, B, beta, C);
}
void backend_gemm(const ComputeContext&, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                  double alpha, const double* A, const double* B, double beta, double* C) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
              K, alpha, A, ta ? M : K, B, tb ? K : N, beta, C, N);
}
}  // namespace

std::array<const uint16_t*, 3> bf16_operands(const ComputeContext& cc,
                                             std::array<Bf16Operand, 3> operands) {
  std::array<const uint16_t*, 3> out{};
  std::array<int64_t, 3> at{};  // each rounded operand's place in the buffer
  int64_t total = 0;
  for (size_t i = 0; i < 3; ++i) {
    const Bf16Operand& o = operands[i];
    out[i] = o.x != nullptr ? known_bits(cc, o.x, o.n) : nullptr;
    at[i] = total;
    if (o.x != nullptr && out[i] == nullptr) total += o.n;
  }
  uint16_t* const buffer = operand_buffer().get(total);
  Bf16Rounding jobs[3];
  size_t count = 0;
  for (size_t i = 0; i < 3; ++i) {
    if (operands[i].x == nullptr || out[i] != nullptr) continue;
    jobs[count++] = {operands[i].x, operands[i].n, buffer + at[i]};
    out[i] = buffer + at[i];
  }
  round_jobs({jobs, count});
  return out;
}

const uint16_t* bf16_operand(const ComputeContext& cc, const float* x, int64_t n) {
  return bf16_operands(cc, {Bf16Operand{x, n}, {}, {}})[0];
}

void round_to_bf16(const float* x, int64_t n, uint16_t* out) {
  round_pair(x, n, out, nullptr, 0, nullptr);
}

void round_to_bf16_all(std::initializer_list<Bf16Rounding> jobs) {
  round_jobs({jobs.begin(), jobs.size()});
}

void round_to_bf16_serial(const float* x, int64_t n, uint16_t* out) {
  (cpu_has("avx512f") ? round_avx512<> : round_scalar<>)(x, n, out, nullptr);
}

void round_to_bf16_widened(const float* x, int64_t n, uint16_t* bits, float* wide) {
  const auto round = cpu_has("avx512f") ? round_avx512<true> : round_scalar<true>;
  constexpr int64_t kChunk = int64_t{1} << 14;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n > kParallelMinWorkLarge)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kChunk, m = std::min(kChunk, n - begin);
    round(x + begin, m, bits + begin, wide + begin);
  }
}

void gemm_bf16_weight(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                      const float* A, const uint16_t* B16, float beta, float* C) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // as gemm: C = beta·C
    for (int64_t i = 0; i < M * N; ++i) C[i] = beta == 0.f ? 0.f : beta * C[i];
    return;
  }
  uint16_t* const a16 = operand_buffer().get(M * K);
  round_pair(A, M * K, a16, nullptr, 0, nullptr);
  detail::onednn_matmul(detail::MatmulInput::kBF16, ta, tb, M, N, K, alpha, a16, B16, beta, C);
}

void widen_bf16(const uint16_t* x, int64_t n, float* out) {
#pragma omp parallel for simd schedule(static) if (n > kParallelMinWorkLarge)
  for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_float(x[i]);
}

template <typename T>
void gemm(const ComputeContext& cc, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
          T alpha, const T* A, const T* B, T beta, T* C) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // BLAS leaves C untouched when K = 0 only for beta = 1; make it explicit.
    for (int64_t i = 0; i < M * N; ++i) C[i] = beta == T(0) ? T(0) : beta * C[i];
    return;
  }
  backend_gemm(cc, trans_a, trans_b, M, N, K, alpha, A, B, beta, C);
}

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          const T* B, T beta, T* C) {
  gemm(ComputeContext::fp32(), trans_a, trans_b, M, N, K, alpha, A, B, beta, C);
}

#define LONGTRON_INSTANTIATE(T)                                                                 \
  template void gemm<T>(const ComputeContext&, bool, bool, int64_t, int64_t, int64_t, T,       \
                        const T*, const T*, T, T*);                                             \
  template void gemm<T>(bool, bool, int64_t, int64_t, int64_t, T, const T*, const T*, T, T*);
LONGTRON_INSTANTIATE(float)
LONGTRON_INSTANTIATE(double)
#undef LONGTRON_INSTANTIATE

}  // namespace longtron::ops
