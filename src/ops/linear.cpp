// Linear layer in the Hugging Face layout W[out, in], through ops::gemm (oneDNN for float).
#include <array>
#include <type_traits>

#include "ops/compute_context.h"
#include "ops/ops.h"
#include "ops/threads.h"

namespace longtron::ops {

namespace {
// y[n, :] += bias for every row n (no-op without a bias).
template <typename T>
void add_bias(T* y, const T* bias, int64_t N, int64_t out) {
  if (bias == nullptr) return;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    T* row = y + n * out;
    for (int64_t o = 0; o < out; ++o) row[o] += bias[o];
  }
}
}  // namespace

template <typename T>
void linear_forward(const ComputeContext& cc, T* y, const T* x, const T* W, const T* bias,
                    int64_t N, int64_t in, int64_t out) {
  gemm<T>(cc, false, true, N, out, in, T(1), x, W, T(0), y);
  add_bias(y, bias, N, out);
}

void linear_forward_bf16(float* y, const float* x, const uint16_t* W16, const float* bias,
                         int64_t N, int64_t in, int64_t out) {
  gemm_bf16_weight(false, true, N, out, in, 1.f, x, W16, 0.f, y);
  add_bias(y, bias, N, out);
}

void linear_forward_bf16(float* y, const uint16_t* x16, const uint16_t* W16, const float* bias,
                         int64_t N, int64_t in, int64_t out) {
  gemm_bf16(false, true, N, out, in, 1.f, x16, W16, 0.f, y);
  add_bias(y, bias, N, out);
}

void linear_input_grad_bf16(float* dx, const uint16_t* dy16, const uint16_t* W16, int64_t N,
                            int64_t in, int64_t out, float beta) {
  gemm_bf16(false, false, N, in, out, 1.f, dy16, W16, beta, dx);
}

template <typename T>
void linear_input_grad(const ComputeContext& cc, T* dx, const T* dy, const T* W, int64_t N,
                       int64_t in, int64_t out, T beta) {
  gemm<T>(cc, false, false, N, in, out, T(1), dy, W, beta, dx);
}

template <typename T>
void linear_weight_grad(const ComputeContext& cc, T* dW, const T* dy, const T* x, int64_t N,
                        int64_t in, int64_t out, T beta) {
  gemm<T>(cc, true, false, out, in, N, T(1), dy, x, beta, dW);
}

namespace {
// Both GEMMs of a backward under bf16 from dy and x rounded once (each GEMM would round dy
// again): the same roundings and the same matmuls as linear_input_grad and linear_weight_grad,
// so the same bits. W16: the weight already in bf16, or nullptr to take W's rounding.
void mixed_backward(const ComputeContext& cc, float* dx, float* dW, const float* dy,
                    const float* x, const float* W, const uint16_t* W16, int64_t N, int64_t in,
                    int64_t out, float dx_beta, float dW_beta) {
  const auto r = bf16_operands(cc, {Bf16Operand{dy, N * out}, Bf16Operand{x, N * in},
                                    Bf16Operand{W16 ? nullptr : W, out * in}});
  gemm_bf16(false, false, N, in, out, 1.f, r[0], W16 ? W16 : r[2], dx_beta, dx);
  gemm_bf16(true, false, out, in, N, 1.f, r[0], r[1], dW_beta, dW);
}
}  // namespace

template <typename T>
void linear_backward(const ComputeContext& cc, T* dx, T* dW, T* dbias, const T* dy, const T* x,
                     const T* W, int64_t N, int64_t in, int64_t out, T dx_beta, T dW_beta) {
  if constexpr (std::is_same_v<T, float>) {
    if (cc.bf16() && dx != nullptr && dW != nullptr && N > 0 && in > 0 && out > 0) {
      mixed_backward(cc, dx, dW, dy, x, W, nullptr, N, in, out, dx_beta, dW_beta);
      return bias_grad(dbias, dy, N, out);
    }
  }
  if (dx != nullptr) linear_input_grad(cc, dx, dy, W, N, in, out, dx_beta);
  if (dW != nullptr) linear_weight_grad(cc, dW, dy, x, N, in, out, dW_beta);
  bias_grad(dbias, dy, N, out);
}

void linear_backward_bf16(const ComputeContext& cc, float* dx, float* dW, float* dbias,
                          const float* dy, const float* x, const uint16_t* W16, int64_t N,
                          int64_t in, int64_t out, float dx_beta, float dW_beta) {
  if (cc.bf16() && dx != nullptr && dW != nullptr && N > 0 && in > 0 && out > 0) {
    mixed_backward(cc, dx, dW, dy, x, nullptr, W16, N, in, out, dx_beta, dW_beta);
    return bias_grad(dbias, dy, N, out);
  }
  if (dx != nullptr) gemm_bf16_weight(false, false, N, in, out, 1.f, dy, W16, dx_beta, dx);
  if (dW != nullptr) linear_weight_grad(cc, dW, dy, x, N, in, out, dW_beta);
  bias_grad(dbias, dy, N, out);
}

namespace {
// Both weights' bits from the context's copy under bf16 (nullptr otherwise): the pair's shared
// rounding of x then fits the operand buffer as one linear's rounded operands do.
std::array<const uint16_t*, 2> pair_weights(const ComputeContext& cc, const float* W1,
                                            const float* W3, int64_t n) {
  if (!cc.bf16()) return {};
  const uint16_t* w1 = cc.weights().of(W1, n);
  const uint16_t* w3 = cc.weights().of(W3, n);
  if (w1 == nullptr || w3 == nullptr) return {};
  return {w1, w3};
}
}  // namespace

template <typename T>
void linear_pair_forward(const ComputeContext& cc, T* a, T* b, const T* x, const T* W1,
                         const T* bias1, const T* W3, const T* bias3, int64_t N, int64_t in,
                         int64_t out) {
  if constexpr (std::is_same_v<T, float>) {
    const auto w = pair_weights(cc, W1, W3, out * in);
    if (w[0] != nullptr && N > 0 && in > 0 && out > 0) {
      const uint16_t* x16 = bf16_operand(cc, x, N * in);
      linear_forward_bf16(a, x16, w[0], bias1, N, in, out);
      linear_forward_bf16(b, x16, w[1], bias3, N, in, out);
      return;
    }
  }
  linear_forward(cc, a, x, W1, bias1, N, in, out);
  linear_forward(cc, b, x, W3, bias3, N, in, out);
}

bool linear_pair_forward_out16(const ComputeContext& cc, uint16_t* a16, uint16_t* b16,
                               const float* x, const float* W1, const float* bias1,
                               const float* W3, const float* bias3, int64_t N, int64_t in,
                               int64_t out) {
  if (bias1 != nullptr || bias3 != nullptr) return false;  // the bias is added in fp32
  const auto w = pair_weights(cc, W1, W3, out * in);
  if (w[0] == nullptr) return false;
  const uint16_t* x16 = bf16_operand(cc, x, N * in);
  gemm_bf16_out16(false, true, N, out, in, x16, w[0], a16);
  gemm_bf16_out16(false, true, N, out, in, x16, w[1], b16);
  return true;
}

bool linear_forward_out16(const ComputeContext& cc, uint16_t* y16, const float* x, const float* W,
                          int64_t N, int64_t in, int64_t out) {
  const uint16_t* w16 = cc.bf16() ? cc.weights().of(W, out * in) : nullptr;
  if (w16 == nullptr) return false;
  const uint16_t* x16 = bf16_operand(cc, x, N * in);
  gemm_bf16_out16(false, true, N, out, in, x16, w16, y16);
  return true;
}

template <typename T>
void linear_pair_backward(const ComputeContext& cc, T* dx, T* dW1, T* dbias1, T* dW3, T* dbias3,
                          const T* da, const T* db, const T* x, const T* W1, const T* W3,
                          int64_t N, int64_t in, int64_t out) {
  if constexpr (std::is_same_v<T, float>) {
    const auto w = pair_weights(cc, W1, W3, out * in);
    const uint16_t* da16 = cc.shared().of(da, N * out);
    const uint16_t* db16 = cc.shared().of(db, N * out);
    if (w[0] != nullptr && dx != nullptr && dW1 != nullptr && dW3 != nullptr && N > 0 &&
        in > 0 && out > 0 && (da16 == nullptr) == (db16 == nullptr)) {
      // x (and da) rounded in one region into this thread's operand buffer, then db into da's
      // place (the buffer is the caller's until its next GEMM; bf16_operands hands it out as
      // const), unless the caller shares the bits of both.
      const bool shared = da16 != nullptr;
      const auto r = bf16_operands(cc, {Bf16Operand{x, N * in}, Bf16Operand{da, N * out}, {}});
      auto* const dy16 = shared ? nullptr : const_cast<uint16_t*>(r[1]);
      gemm_bf16(false, false, N, in, out, 1.f, r[1], w[0], 0.f, dx);
      gemm_bf16(true, false, out, in, N, 1.f, r[1], r[0], 1.f, dW1);
      bias_grad(dbias1, da, N, out);
      if (!shared) round_to_bf16(db, N * out, dy16);
      const uint16_t* const b16 = shared ? db16 : dy16;
      gemm_bf16(false, false, N, in, out, 1.f, b16, w[1], 1.f, dx);
      gemm_bf16(true, false, out, in, N, 1.f, b16, r[0], 1.f, dW3);
      bias_grad(dbias3, db, N, out);
      return;
    }
  }
  linear_backward(cc, dx, dW1, dbias1, da, x, W1, N, in, out, T(0), T(1));
  linear_backward(cc, dx, dW3, dbias3, db, x, W3, N, in, out, T(1), T(1));
}

// The float32 forms.
template <typename T>
void linear_forward(T* y, const T* x, const T* W, const T* bias, int64_t N, int64_t in,
                    int64_t out) {
  linear_forward(ComputeContext::fp32(), y, x, W, bias, N, in, out);
}
template <typename T>
void linear_backward(T* dx, T* dW, T* dbias, const T* dy, const T* x, const T* W, int64_t N,
                     int64_t in, int64_t out, T dx_beta, T dW_beta) {
  linear_backward(ComputeContext::fp32(), dx, dW, dbias, dy, x, W, N, in, out, dx_beta, dW_beta);
}
template <typename T>
void linear_input_grad(T* dx, const T* dy, const T* W, int64_t N, int64_t in, int64_t out,
                       T beta) {
  linear_input_grad(ComputeContext::fp32(), dx, dy, W, N, in, out, beta);
}
template <typename T>
void linear_weight_grad(T* dW, const T* dy, const T* x, int64_t N, int64_t in, int64_t out, T beta) {
  linear_weight_grad(ComputeContext::fp32(), dW, dy, x, N, in, out, beta);
}

template <typename T>
void bias_grad(T* dbias, const T* dy, int64_t rows, int64_t out) {
  if (dbias == nullptr) return;
  // Column sums: each thread owns a range of output features, so there is no race.
#pragma omp parallel for schedule(static) if (rows * out > kParallelMinWorkLarge)
  for (int64_t o = 0; o < out; ++o) {
    double sum = 0.0;
    for (int64_t n = 0; n < rows; ++n) sum += static_cast<double>(dy[n * out + o]);
    dbias[o] += static_cast<T>(sum);
  }
}

#define LONGTRON_INSTANTIATE(T)                                                               \
  template void linear_pair_forward<T>(const ComputeContext&, T*, T*, const T*, const T*,      \
                                       const T*, const T*, const T*, int64_t, int64_t, int64_t); \
  template void linear_pair_backward<T>(const ComputeContext&, T*, T*, T*, T*, T*, const T*,   \
                                        const T*, const T*, const T*, const T*, int64_t,       \
                                        int64_t, int64_t);                                      \
  template void linear_forward<T>(T*, const T*, const T*, const T*, int64_t, int64_t, int64_t); \
  template void linear_backward<T>(T*, T*, T*, const T*, const T*, const T*, int64_t, int64_t,  \
                                   int64_t, T, T);                                                \
  template void linear_input_grad<T>(T*, const T*, const T*, int64_t, int64_t, int64_t, T);      \
  template void linear_weight_grad<T>(T*, const T*, const T*, int64_t, int64_t, int64_t, T);     \
  template void linear_forward<T>(const ComputeContext&, T*, const T*, const T*, const T*,       \
                                  int64_t, int64_t, int64_t);                                    \
  template void linear_backward<T>(const ComputeContext&, T*, T*, T*, const T*, const T*,        \
                                   const T*, int64_t, int64_t, int64_t, T, T);                   \
  template void linear_input_grad<T>(const ComputeContext&, T*, const T*, const T*, int64_t,     \
                                     int64_t, int64_t, T);                                       \
  template void linear_weight_grad<T>(const ComputeContext&, T*, const T*, const T*, int64_t,    \
                                      int64_t, int64_t, T);                                      \
  template void bias_grad<T>(T*, const T*, int64_t, int64_t);
LONGTRON_INSTANTIATE(float)
LONGTRON_INSTANTIATE(double)
#undef LONGTRON_INSTANTIATE

}  // namespace longtron::ops
