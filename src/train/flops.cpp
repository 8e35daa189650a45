#include "train/flops.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "core/error.h"
#include "core/safetensors.h"
#include "ops/ops.h"

namespace longtron::train {

namespace {
// Deterministic, non-trivial values (denormals or zeros could take a different path).
float value_a(size_t i) { return static_cast<float>((i * 7919) % 1000) * 1e-3f - 0.5f; }
float value_b(size_t i) { return static_cast<float>((i * 104729) % 1000) * 1e-3f - 0.5f; }

// FLOP/s of `call` (one n³ GEMM): a warm-up call (JIT, primitive creation), then the best of
// `repeats`.
template <typename F>
double best_rate(int64_t n, int repeats, F&& call) {
  call();
  double best = 1e30;
  for (int r = 0; r < std::max(1, repeats); ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    call();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / best;
}
}  // namespace

double measure_sgemm_flops(int64_t n, int repeats) {
  const size_t size = static_cast<size_t>(n * n);
  std::vector<float> A(size), B(size), C(size);
  for (size_t i = 0; i < size; ++i) A[i] = value_a(i), B[i] = value_b(i);
  return best_rate(n, repeats, [&] {
    ops::gemm<float>(false, false, n, n, n, 1.0f, A.data(), B.data(), 0.0f, C.data());
  });
}

double measure_gemm_bf16_flops(int64_t n, int repeats) {
  const size_t size = static_cast<size_t>(n * n);
  std::vector<uint16_t> A(size), B(size);
  std::vector<float> C(size);
  for (size_t i = 0; i < size; ++i) A[i] = safetensors::float_to_bf16(value_a(i)), B[i] = safetensors::float_to_bf16(value_b(i));
  try {
    return best_rate(n, repeats, [&] {
      ops::gemm_bf16(false, false, n, n, n, 1.0f, A.data(), B.data(), 0.0f, C.data());
    });
  } catch (const Error&) {
    return 0.0;  // no bf16 matmul on this CPU: reported as such at start-up
  }
}

double step_mfu(double flops_per_s, double& gemm_flops, int& retimes_left,
                const std::function<double()>& retime) {
  double mfu = flops_per_s / gemm_flops;
  if (mfu > 1.0 && retimes_left > 0) {
    --retimes_left;
    gemm_flops = std::max(gemm_flops, retime());
    mfu = flops_per_s / gemm_flops;
  }
  return mfu;
}

double measure_gemm_flops(ops::ComputeType compute, int64_t n) {
  return compute == ops::ComputeType::kBFloat16 ? measure_gemm_bf16_flops(n) : measure_sgemm_flops(n);
}

}  // namespace longtron::train
