#include "train/flops.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "ops/ops.h"

namespace longtron::train {

double measure_sgemm_flops(int64_t n, int repeats) {
  const size_t size = static_cast<size_t>(n * n);
  std::vector<float> A(size), B(size), C(size);
  // Deterministic, non-trivial values (denormals or zeros could take a different path).
  for (size_t i = 0; i < size; ++i) {
    A[i] = static_cast<float>((i * 7919) % 1000) * 1e-3f - 0.5f;
    B[i] = static_cast<float>((i * 104729) % 1000) * 1e-3f - 0.5f;
  }
  ops::gemm<float>(false, false, n, n, n, 1.0f, A.data(), B.data(), 0.0f, C.data());
  double best = 1e30;
  for (int r = 0; r < std::max(1, repeats); ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    ops::gemm<float>(false, false, n, n, n, 1.0f, A.data(), B.data(), 0.0f, C.data());
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / best;
}

}  // namespace longtron::train
