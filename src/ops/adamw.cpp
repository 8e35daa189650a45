// AdamW (Loshchilov & Hutter 2019) exactly as torch.optim.AdamW (non-amsgrad, non-fused):
//   p ← p·(1 − lr·wd);  m ← β1 m + (1−β1) g;  v ← β2 v + (1−β2) g²;
//   p ← p − (lr / (1−β1^t)) · m / (sqrt(v) / sqrt(1−β2^t) + eps).
// This file is compiled with -fno-math-errno (CMakeLists.txt): std::sqrt then needs no errno
// branch and the loops vectorise (vsqrtps); sqrt is correctly rounded either way, so the values
// are those of the scalar loop. And with -ffp-contract=off: the multiply-adds fused are the
// std::fma calls, the same in the vector loop, its remainder and on any CPU.
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "ops/ops.h"

namespace longtron::ops {

namespace {

// Elements per work item of the update: the fused rounding reads a chunk back from L1/L2.
constexpr int64_t kUpdateChunk = 4096;

// The constants of step `step` shared by the update, its check and its bound.
struct AdamWStep {
  float beta1, beta2, eps, step_size, inv_sqrt_bc2, decay, grad_scale;
  AdamWStep(const AdamWArgs& a, float weight_decay)
      : beta1(a.beta1), beta2(a.beta2), eps(a.eps), grad_scale(a.grad_scale) {
    check(a.step >= 1, "adamw: step is 1-based, got {}", a.step);
    const double bc1 = 1.0 - std::pow(static_cast<double>(a.beta1), static_cast<double>(a.step));
    const double bc2 = 1.0 - std::pow(static_cast<double>(a.beta2), static_cast<double>(a.step));
    step_size = static_cast<float>(a.lr / bc1);
    inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
    decay = 1.0f - a.lr * weight_decay;
  }
  // The gradient as the update reads it (x · 1 is x: no clip, the gradient as stored).
  float g(float g0) const { return g0 * grad_scale; }
  // The fused multiply-adds are written out (and nothing else is fused: -ffp-contract=off), so
  // the values do not depend on the compiler's contraction choices or on the CPU.
  float m(float m0, float g) const { return std::fma(beta1, m0, (1.0f - beta1) * g); }
  float v(float v0, float g) const { return std::fma(beta2, v0, (1.0f - beta2) * g * g); }
  float p(float p0, float mi, float vi) const {
    return p0 * decay - step_size * mi / std::fma(std::sqrt(vi), inv_sqrt_bc2, eps);
  }
};

// The work items of an update: chunks of at most kUpdateChunk elements, none across two ranges.
struct Chunk {
  int64_t begin, end;
  bool decay;
};
std::vector<Chunk> chunks_of(std::span<const AdamWRange> ranges) {
  std::vector<Chunk> out;
  for (const AdamWRange& r : ranges)
    for (int64_t b = r.begin; b < r.end; b += kUpdateChunk)
      out.push_back({b, std::min(r.end, b + kUpdateChunk), r.decay});
  return out;
}

// x − x is 0 for a finite x and NaN for ±inf or NaN: one test for several values.
inline bool all_finite(float a, float b, float c) { return (a - a) + (b - b) + (c - c) == 0.0f; }

// The update of elements [b, e), folding the bounds of what it writes into `st`.
inline void update_range(const AdamWStep& s, float* param, float* m, float* v, const float* grad,
                         int64_t b, int64_t e, AdamWStats& st) {
  float max_m = st.max_abs_m, max_v = st.max_v, min_v = st.min_v;
  int bad = 0;
#pragma omp simd reduction(max : max_m, max_v) reduction(min : min_v) reduction(| : bad)
  for (int64_t i = b; i < e; ++i) {
    const float g = s.g(grad[i]);
    const float mi = s.m(m[i], g);
    const float vi = s.v(v[i], g);
    const float pi = s.p(param[i], mi, vi);
    m[i] = mi;
    v[i] = vi;
    param[i] = pi;
    max_m = std::max(max_m, std::abs(mi));
    max_v = std::max(max_v, vi);
    min_v = std::min(min_v, vi);
    bad |= !all_finite(mi, vi, pi);
  }
  st.max_abs_m = max_m, st.max_v = max_v, st.min_v = min_v;
  st.finite = st.finite && bad == 0;
}

}  // namespace

AdamWStats adamw_update(float* param, float* m, float* v, const float* grad,
                        std::span<const AdamWRange> ranges, const AdamWArgs& a,
                        uint16_t* param16) {
  const AdamWStep with(a, a.weight_decay), without(a, 0.0f);
  const std::vector<Chunk> chunks = chunks_of(ranges);
  const auto n = static_cast<int64_t>(chunks.size());
  float max_m = 0, max_v = 0, min_v = std::numeric_limits<float>::infinity();
  int bad = 0;
  // One parallel region for every range (each fork costs a wake-up of the sleeping threads).
  // Each chunk's new parameters are rounded (vectorised) while they are still in cache, so
  // memory is read once, not once for the update and once more for the copy.
#pragma omp parallel for schedule(static) reduction(max : max_m, max_v) reduction(min : min_v) \
    reduction(| : bad)
  for (int64_t c = 0; c < n; ++c) {
    const Chunk& k = chunks[static_cast<size_t>(c)];
    AdamWStats st{max_m, max_v, min_v, true};
    update_range(k.decay ? with : without, param, m, v, grad, k.begin, k.end, st);
    if (param16 != nullptr) round_to_bf16_serial(param + k.begin, k.end - k.begin, param16 + k.begin);
    max_m = st.max_abs_m, max_v = st.max_v, min_v = st.min_v;
    bad |= !st.finite;
  }
  return AdamWStats{max_m, max_v, min_v, bad == 0};
}

bool adamw_update_is_finite(const float* param, const float* m, const float* v, const float* grad,
                            std::span<const AdamWRange> ranges, const AdamWArgs& a) {
  const AdamWStep with(a, a.weight_decay), without(a, 0.0f);
  const std::vector<Chunk> chunks = chunks_of(ranges);
  const auto n = static_cast<int64_t>(chunks.size());
  int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad)
  for (int64_t c = 0; c < n; ++c) {
    const Chunk& k = chunks[static_cast<size_t>(c)];
    const AdamWStep& s = k.decay ? with : without;
    int chunk_bad = 0;
#pragma omp simd reduction(| : chunk_bad)
    for (int64_t i = k.begin; i < k.end; ++i) {
      const float g = s.g(grad[i]);
      const float mi = s.m(m[i], g);
      const float vi = s.v(v[i], g);
      chunk_bad |= !all_finite(mi, vi, s.p(param[i], mi, vi));
    }
    bad |= chunk_bad;
  }
  return bad == 0;
}

bool adamw_bounds_imply_finite(const AdamWStats& last, double grad_max_abs, const AdamWArgs& a) {
  // Every comparison is written so that a NaN anywhere fails it (and the caller checks exactly).
  const double inf = std::numeric_limits<double>::infinity();
  const double b1 = a.beta1, b2 = a.beta2, G = grad_max_abs;
  if (!last.finite || !(last.min_v >= 0) || !(a.step >= 1) || !(a.eps > 0) || !(a.lr >= 0) ||
      !(b1 >= 0 && b1 <= 1) || !(b2 >= 0 && b2 < 1) || !(G >= 0 && G < inf))
    return false;
  const AdamWStep s(a, a.weight_decay);
  // Both decays (1 and 1 − lr·wd) in [0, 1]: |p·decay| ≤ |p| ≤ FLT_MAX.
  if (!(s.decay >= 0 && s.decay <= 1) || !(s.step_size >= 0 && s.step_size < inf) ||
      !(s.inv_sqrt_bc2 > 0 && s.inv_sqrt_bc2 < inf))
    return false;
  // Each float operation rounds by at most 2⁻²⁴ relative; k covers the few in a chain, and the
  // limits leave orders of magnitude below FLT_MAX (3.4e38) for every intermediate.
  constexpr double k = 1 + 1e-5, kLimit = 1e37;
  // The coefficients as the update computes them (1 − β in float).
  const double c1 = double(1.0f - a.beta1), c2 = double(1.0f - a.beta2);
  const double m_bound = (b1 * last.max_abs_m + c1 * G) * k;
  const double v_bound = (b2 * last.max_v + c2 * G * G) * k;
  if (!(G * G * k < kLimit && m_bound < kLimit && v_bound < kLimit)) return false;
  // v ≥ 0 (min_v ≥ 0 and g² ≥ 0), so the denominator sqrt(v)·c + eps ≥ eps: the step is at most
  // step_size·|m|/eps. Below 2¹⁰³ (half an ulp of FLT_MAX) it cannot carry a finite p·decay past
  // FLT_MAX under round-to-nearest, with or without a fused multiply-add.
  const double step_bound = double(s.step_size) * m_bound * k / double(a.eps) * k;
  return step_bound < 1e30;
}

void adamw_update(float* param, float* m, float* v, const float* grad, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t step,
                  uint16_t* param16) {
  const AdamWRange all{0, n, true};
  adamw_update(param, m, v, grad, {&all, 1}, AdamWArgs{lr, beta1, beta2, eps, weight_decay, step},
               param16);
}

bool adamw_update_is_finite(const float* param, const float* m, const float* v, const float* grad,
                            int64_t n, float lr, float beta1, float beta2, float eps,
                            float weight_decay, int64_t step) {
  const AdamWRange all{0, n, true};
  return adamw_update_is_finite(param, m, v, grad, {&all, 1},
                                AdamWArgs{lr, beta1, beta2, eps, weight_decay, step});
}

}  // namespace longtron::ops
