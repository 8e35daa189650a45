// Warmup + cosine learning rate at known steps, and gradient-norm clipping (docs/training.md).
#include "train/schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numbers>
#include <vector>

#include "ops/sum_squares.h"

using longtron::train::clip_grad_norm;
using longtron::train::LrSchedule;

TEST(Schedule, WarmupThenCosineAtKnownSteps) {
  const LrSchedule s{.lr = 1e-3, .min_lr = 1e-4, .warmup_steps = 10, .total_steps = 110};
  EXPECT_DOUBLE_EQ(s.at(1), 1e-4);  // lr / warmup_steps at step 1
  EXPECT_DOUBLE_EQ(s.at(5), 5e-4);
  EXPECT_DOUBLE_EQ(s.at(10), 1e-3);  // peak at warmup_steps
  EXPECT_NEAR(s.at(35), 1e-4 + 9e-4 * 0.5 * (1 + std::cos(std::numbers::pi / 4)), 1e-15);
  EXPECT_NEAR(s.at(60), 5.5e-4, 1e-15);  // half way through the cosine
  EXPECT_NEAR(s.at(110), 1e-4, 1e-15);   // min_lr at total_steps
  EXPECT_NEAR(s.at(500), 1e-4, 1e-15);   // and after
  EXPECT_DOUBLE_EQ(s.at(0), s.at(1));
  for (int64_t t = 11; t <= 110; ++t) EXPECT_LT(s.at(t), s.at(t - 1)) << t;
}

TEST(Schedule, NoWarmup) {
  const LrSchedule s{.lr = 2e-3, .min_lr = 0, .warmup_steps = 0, .total_steps = 100};
  EXPECT_NEAR(s.at(1), 1e-3 * (1 + std::cos(std::numbers::pi * 0.01)), 1e-15);
  EXPECT_NEAR(s.at(50), 1e-3, 1e-15);
  EXPECT_NEAR(s.at(100), 0.0, 1e-18);
}

TEST(Schedule, WarmupEqualsTotal) {
  const LrSchedule s{.lr = 1.0, .min_lr = 0.1, .warmup_steps = 4, .total_steps = 4};
  EXPECT_DOUBLE_EQ(s.at(2), 0.5);
  EXPECT_DOUBLE_EQ(s.at(4), 1.0);
  EXPECT_DOUBLE_EQ(s.at(5), 0.1);  // past the end: min_lr
}

TEST(Clip, ScalesWhenAboveMax) {
  auto r = clip_grad_norm(25.0, 1.0);
  EXPECT_DOUBLE_EQ(r.grad_norm, 5.0);
  EXPECT_DOUBLE_EQ(r.scale, 1.0 / (5.0 + 1e-6));
  EXPECT_TRUE(r.finite);
  r = clip_grad_norm(0.25, 1.0);
  EXPECT_DOUBLE_EQ(r.grad_norm, 0.5);
  EXPECT_DOUBLE_EQ(r.scale, 1.0);
  r = clip_grad_norm(25.0, 0.0);  // disabled
  EXPECT_DOUBLE_EQ(r.scale, 1.0);
  r = clip_grad_norm(std::numeric_limits<double>::infinity(), 1.0);
  EXPECT_FALSE(r.finite);
  EXPECT_DOUBLE_EQ(r.scale, 1.0);
  EXPECT_FALSE(clip_grad_norm(std::nan(""), 1.0).finite);
}

TEST(Clip, NormAndScaleOfABuffer) {
  std::vector<float> g(1001);
  double want = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    g[i] = float(std::sin(double(i))) * 3.0f;
    want += double(g[i]) * double(g[i]);
  }
  EXPECT_NEAR(longtron::ops::sum_squares(g.data(), int64_t(g.size())), want, 1e-9 * want);
  const auto r = clip_grad_norm(want, 1.0);
  for (float& x : g) x *= float(r.scale);  // as AdamW reads each gradient
  EXPECT_NEAR(std::sqrt(longtron::ops::sum_squares(g.data(), int64_t(g.size()))), 1.0, 1e-5);
}
