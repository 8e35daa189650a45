// The fused AdamW pass: its values against double, their independence of thread count and of
// where a range starts (vector body vs remainder), the bounds it reports, and the soundness of
// the bound that spares the finiteness check its pass (never "finite" when the exact check says
// otherwise).
#include <gtest/gtest.h>
#include <omp.h>

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/bf16.h"
#include "ops/ops.h"

namespace ops = longtron::ops;
using Floats = std::vector<float>;

namespace {

struct State {
  Floats p, m, v, g;
};

State random_state(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  State s{Floats(n), Floats(n), Floats(n), Floats(n)};
  for (int64_t i = 0; i < n; ++i) {
    s.p[i] = normal(rng);
    s.m[i] = 0.01f * normal(rng);
    s.v[i] = 1e-4f * std::abs(normal(rng));
    s.g[i] = 0.1f * normal(rng);
  }
  return s;
}

ops::AdamWStats update(State& s, std::span<const ops::AdamWRange> ranges, const ops::AdamWArgs& a,
                       uint16_t* bits = nullptr) {
  return ops::adamw_update(s.p.data(), s.m.data(), s.v.data(), s.g.data(), ranges, a, bits);
}

bool same_bits(const Floats& a, const Floats& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

// Three ranges (decay, none, decay) against PyTorch's formula in double; the bf16 copy is the
// rounding of the new weights.
TEST(AdamWFused, RangesMatchTheFormulaInDouble) {
  const int64_t n = 3 * 4096 + 77;
  State s = random_state(n, 1);
  const State before = s;
  const ops::AdamWArgs a{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 7};
  const ops::AdamWRange ranges[] = {{0, 5000, true}, {5000, 5003, false}, {5003, n, true}};
  std::vector<uint16_t> bits(n);
  update(s, ranges, a, bits.data());
  // The float hyper-parameters, in double.
  const double b1 = a.beta1, b2 = a.beta2, lr = a.lr, eps = a.eps, wd = a.weight_decay;
  const double bc1 = 1 - std::pow(b1, 7), bc2 = 1 - std::pow(b2, 7);
  for (int64_t i = 0; i < n; ++i) {
    const double g = before.g[i];
    const double m = b1 * before.m[i] + (1 - b1) * g, v = b2 * before.v[i] + (1 - b2) * g * g;
    const double decay = (i >= 5000 && i < 5003) ? 1.0 : 1.0 - lr * wd;
    const double p = before.p[i] * decay - lr / bc1 * m / (std::sqrt(v / bc2) + eps);
    // Float rounding, relative to the terms summed (a sum can cancel).
    ASSERT_NEAR(s.m[i], m, 1e-6 * (std::abs(b1 * before.m[i]) + std::abs((1 - b1) * g))) << i;
    ASSERT_NEAR(s.v[i], v, 1e-6 * v) << i;
    ASSERT_NEAR(s.p[i], p, 1e-6 * (std::abs(before.p[i]) + std::abs(before.p[i] - p))) << i;
    ASSERT_EQ(bits[i], longtron::float_to_bf16(s.p[i])) << i;
  }
}

// Elementwise: 1 or 2 threads, one call over all ranges or one call per range at other
// alignments (so an element falls in the vector body in one run and in a remainder in the
// other) give the same bits.
TEST(AdamWFused, BitsDoNotDependOnThreadsOrAlignment) {
  const int64_t n = 2 * 4096 + 531;
  const ops::AdamWArgs a{3e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 3};
  const ops::AdamWRange ranges[] = {{0, 4099, true}, {4099, 4100, false}, {4100, n, true}};
  State one = random_state(n, 2), two = one, split = one;
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  update(one, ranges, a);
  omp_set_num_threads(2);
  update(two, ranges, a);
  omp_set_num_threads(threads);
  for (const ops::AdamWRange& r : ranges) {
    const ops::AdamWRange whole{0, r.end - r.begin, r.decay};
    ops::adamw_update(split.p.data() + r.begin, split.m.data() + r.begin, split.v.data() + r.begin,
                      split.g.data() + r.begin, {&whole, 1}, a);
  }
  EXPECT_TRUE(same_bits(one.p, two.p) && same_bits(one.m, two.m) && same_bits(one.v, two.v));
  EXPECT_TRUE(same_bits(one.p, split.p) && same_bits(one.m, split.m) && same_bits(one.v, split.v));
}

// A clip factor read with each gradient (grad_scale) is, bit for bit, the update on gradients
// multiplied by it beforehand, and leaves the gradients as they were; so is the finiteness check.
TEST(AdamWFused, GradScaleIsTheUpdateOnScaledGradients) {
  const int64_t n = 2 * 4096 + 33;
  State fused = random_state(n, 4), scaled = fused;
  const Floats grads = fused.g;
  const float f = 0.37f;
  for (float& g : scaled.g) g *= f;
  ops::AdamWArgs a{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3};
  const ops::AdamWRange ranges[] = {{0, 4100, true}, {4100, n, false}};
  const ops::AdamWStats want = update(scaled, ranges, a);
  a.grad_scale = f;
  const ops::AdamWStats got = update(fused, ranges, a);
  EXPECT_TRUE(same_bits(fused.p, scaled.p));
  EXPECT_TRUE(same_bits(fused.m, scaled.m));
  EXPECT_TRUE(same_bits(fused.v, scaled.v));
  EXPECT_TRUE(same_bits(fused.g, grads));
  EXPECT_EQ(got.max_abs_m, want.max_abs_m);
  EXPECT_EQ(got.max_v, want.max_v);
  // A gradient whose square overflows only unscaled: the check reads it scaled.
  fused.g[5] = 1e30f;
  a.grad_scale = 1e-20f;
  EXPECT_TRUE(ops::adamw_update_is_finite(fused.p.data(), fused.m.data(), fused.v.data(),
                                          fused.g.data(), ranges, a));
  a.grad_scale = 1.0f;
  EXPECT_FALSE(ops::adamw_update_is_finite(fused.p.data(), fused.m.data(), fused.v.data(),
                                           fused.g.data(), ranges, a));
}

TEST(AdamWFused, StatsAreThoseOfTheWrittenState) {
  const int64_t n = 4096 + 13;
  State s = random_state(n, 3);
  const ops::AdamWRange all{0, n, true};
  const ops::AdamWStats st = update(s, {&all, 1}, {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1});
  float max_m = 0, max_v = 0, min_v = FLT_MAX;
  for (int64_t i = 0; i < n; ++i) {
    max_m = std::max(max_m, std::abs(s.m[i]));
    max_v = std::max(max_v, s.v[i]);
    min_v = std::min(min_v, s.v[i]);
  }
  EXPECT_EQ(st.max_abs_m, max_m);
  EXPECT_EQ(st.max_v, max_v);
  EXPECT_EQ(st.min_v, min_v);
  EXPECT_TRUE(st.finite);
  // An infinite step size: the weights it writes are not finite, and the stats say so.
  EXPECT_FALSE(update(s, {&all, 1}, {std::numeric_limits<float>::infinity(), 0.9f, 0.95f, 1e-8f, 0.1f, 2}).finite);
}

// A training-like state is proven finite from its bounds alone, and the bound refuses what it
// cannot prove: an infinite learning rate, a missing gradient bound, negative or non-finite
// moments, eps = 0.
TEST(AdamWBounds, ProveTheUsualStepAndRefuseWhatTheyCannot) {
  const ops::AdamWStats st{0.05f, 1e-3f, 0.0f, true};
  const ops::AdamWArgs a{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 100};
  EXPECT_TRUE(ops::adamw_bounds_imply_finite(st, 10.0, a));
  EXPECT_FALSE(ops::adamw_bounds_imply_finite(st, INFINITY, a));
  // A gradient whose square overflows float makes v infinite, however small the step.
  ops::AdamWArgs tiny = a;
  tiny.lr = 1e-30f, tiny.beta2 = 0;
  float p = 1, m = 0, v = 0;
  const float g = 2.5e19f;  // g² = 6.25e38 > FLT_MAX
  const ops::AdamWRange one{0, 1, true};
  ASSERT_FALSE(ops::adamw_update_is_finite(&p, &m, &v, &g, {&one, 1}, tiny));
  EXPECT_FALSE(ops::adamw_bounds_imply_finite(st, g, tiny));
  ops::AdamWArgs lr = a;
  lr.lr = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(ops::adamw_bounds_imply_finite(st, 10.0, lr));
  ops::AdamWArgs eps = a;
  eps.eps = 0;
  EXPECT_FALSE(ops::adamw_bounds_imply_finite(st, 10.0, eps));
  EXPECT_FALSE(ops::adamw_bounds_imply_finite({0.05f, 1e-3f, -1e-9f, true}, 10.0, a));
  EXPECT_FALSE(ops::adamw_bounds_imply_finite({0.05f, 1e-3f, 0.0f, false}, 10.0, a));
}

// Soundness over states of every magnitude, weights up to FLT_MAX included: whenever the bound
// says the update is finite, the exact check (the update's own arithmetic) agrees. The bound
// must also prove a good share of them, or it would spare no pass.
TEST(AdamWBounds, NeverFiniteWhereTheExactCheckIsNot) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(0, 1);
  const auto log_uniform = [&](double lo, double hi) { return std::pow(10.0, lo + (hi - lo) * u(rng)); };
  const auto pick = [&](std::initializer_list<float> xs) {
    return *(xs.begin() + static_cast<size_t>(u(rng) * double(xs.size())) % xs.size());
  };
  const int64_t n = 37;
  int proven = 0, exact_false = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    const double ms = log_uniform(-10, 38.5), vs = log_uniform(-10, 38.5), gs = log_uniform(-10, 21);
    const double ps = log_uniform(-3, 38.6);
    State s{Floats(n), Floats(n), Floats(n), Floats(n)};
    for (int64_t i = 0; i < n; ++i) {
      const double sign = u(rng) < 0.5 ? -1 : 1;
      s.m[i] = float(std::min(ms * u(rng), double(FLT_MAX))) * float(sign);
      s.v[i] = float(std::min(vs * u(rng), double(FLT_MAX)));
      s.p[i] = float(std::min(ps * u(rng), double(FLT_MAX))) * float(-sign);
      s.g[i] = float(std::min(gs * (2 * u(rng) - 1), double(FLT_MAX)));
    }
    if (trial % 7 == 0) s.p[0] = FLT_MAX;  // a weight at the top of the range
    const ops::AdamWArgs a{float(log_uniform(-40, 39)), pick({0.0f, 0.5f, 0.9f, 0.999f, 1.0f}),
                           pick({0.0f, 0.9f, 0.95f, 0.999f}), float(log_uniform(-40, 0)),
                           pick({0.0f, 0.1f, 1e3f}), int64_t(1 + u(rng) * 1000)};
    ops::AdamWStats st{0, 0, FLT_MAX, true};
    double G = 0;
    for (int64_t i = 0; i < n; ++i) {
      st.max_abs_m = std::max(st.max_abs_m, std::abs(s.m[i]));
      st.max_v = std::max(st.max_v, s.v[i]);
      st.min_v = std::min(st.min_v, s.v[i]);
      st.finite = st.finite && std::isfinite(s.p[i]) && std::isfinite(s.m[i]) && std::isfinite(s.v[i]);
      G = std::max(G, double(std::abs(s.g[i])));
    }
    const ops::AdamWRange all{0, n, trial % 2 == 0};
    const bool exact = ops::adamw_update_is_finite(s.p.data(), s.m.data(), s.v.data(), s.g.data(),
                                                   {&all, 1}, a);
    const bool bound = ops::adamw_bounds_imply_finite(st, G, a);
    exact_false += !exact;
    proven += bound;
    ASSERT_TRUE(!bound || exact) << "trial " << trial << ": lr " << a.lr << " eps " << a.eps
                                 << " beta1 " << a.beta1 << " G " << G;
    if (bound) {  // and the update itself then writes finite values only
      State w = s;
      ASSERT_TRUE(update(w, {&all, 1}, a).finite) << trial;
    }
  }
  EXPECT_GT(proven, 150);
  EXPECT_GT(exact_false, 400);
  std::printf("[bounds] %d of 4000 states proven finite, %d not finite\n", proven, exact_false);
}
