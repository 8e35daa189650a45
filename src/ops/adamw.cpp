// AdamW (Loshchilov & Hutter 2019) exactly as torch.optim.AdamW (non-amsgrad, non-fused):
//   p ← p·(1 − lr·wd);  m ← β1 m + (1−β1) g;  v ← β2 v + (1−β2) g²;
//   p ← p − (lr / (1−β1^t)) · m / (sqrt(v) / sqrt(1−β2^t) + eps).
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "ops/ops.h"

namespace longtron::ops {

namespace {

// Elements per work item of the update: the fused rounding reads a chunk back from L1/L2.
constexpr int64_t kUpdateChunk = 4096;

// The constants of step `step` shared by the update and its check.
struct AdamWStep {
  float beta1, beta2, eps, step_size, inv_sqrt_bc2, decay;
  AdamWStep(float lr, float b1, float b2, float e, float weight_decay, int64_t step)
      : beta1(b1), beta2(b2), eps(e) {
    check(step >= 1, "adamw: step is 1-based, got {}", step);
    const double bc1 = 1.0 - std::pow(static_cast<double>(b1), static_cast<double>(step));
    const double bc2 = 1.0 - std::pow(static_cast<double>(b2), static_cast<double>(step));
    step_size = static_cast<float>(lr / bc1);
    inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
    decay = 1.0f - lr * weight_decay;
  }
  float m(float m0, float g) const { return beta1 * m0 + (1.0f - beta1) * g; }
  float v(float v0, float g) const { return beta2 * v0 + (1.0f - beta2) * g * g; }
  float p(float p0, float mi, float vi) const {
    return p0 * decay - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps);
  }
};

}  // namespace

namespace {
// The update of elements [b, e).
inline void update_range(const AdamWStep& s, float* param, float* m, float* v, const float* grad,
                         int64_t b, int64_t e) {
#pragma omp simd
  for (int64_t i = b; i < e; ++i) {
    const float g = grad[i];
    const float mi = s.m(m[i], g);
    const float vi = s.v(v[i], g);
    m[i] = mi;
    v[i] = vi;
    param[i] = s.p(param[i], mi, vi);
  }
}
}  // namespace

void adamw_update(float* param, float* m, float* v, const float* grad, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t step,
                  uint16_t* param16) {
  const AdamWStep s(lr, beta1, beta2, eps, weight_decay, step);
  if (param16 == nullptr) {
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < (n + kUpdateChunk - 1) / kUpdateChunk; ++c)
      update_range(s, param, m, v, grad, c * kUpdateChunk, std::min(n, (c + 1) * kUpdateChunk));
    return;
  }
  // Fused: each chunk's new parameters are rounded (vectorised) while they are still in cache,
  // so memory is read once, not once for the update and once more for the copy.
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < (n + kUpdateChunk - 1) / kUpdateChunk; ++c) {
    const int64_t b = c * kUpdateChunk, e = std::min(n, b + kUpdateChunk);
    update_range(s, param, m, v, grad, b, e);
    round_to_bf16_serial(param + b, e - b, param16 + b);
  }
}

bool adamw_update_is_finite(const float* param, const float* m, const float* v, const float* grad,
                            int64_t n, float lr, float beta1, float beta2, float eps,
                            float weight_decay, int64_t step) {
  const AdamWStep s(lr, beta1, beta2, eps, weight_decay, step);
  int bad = 0;
#pragma omp parallel for simd schedule(static) reduction(| : bad)
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i];
    const float mi = s.m(m[i], g);
    const float vi = s.v(v[i], g);
    const float pi = s.p(param[i], mi, vi);
    // x − x is 0 for a finite x and NaN for ±inf or NaN: one test for all three values.
    bad |= !((mi - mi) + (vi - vi) + (pi - pi) == 0.0f);
  }
  return bad == 0;
}

}  // namespace longtron::ops
