// train::step_mfu: an MFU above 1 (the start-up GEMM timing caught a slow patch) re-times the GEMM
// a bounded number of times and keeps the faster rate; MFU at or below 1 never re-times.
#include "train/flops.h"

#include <gtest/gtest.h>

namespace {

using longtron::train::step_mfu;

TEST(StepMfu, BelowOneNeverRetimes) {
  double gemm = 100.0;
  int left = 3, calls = 0;
  EXPECT_DOUBLE_EQ(step_mfu(80.0, gemm, left, [&] { return ++calls, 500.0; }), 0.8);
  EXPECT_DOUBLE_EQ(step_mfu(100.0, gemm, left, [&] { return ++calls, 500.0; }), 1.0);
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(left, 3);
  EXPECT_DOUBLE_EQ(gemm, 100.0);
}

TEST(StepMfu, AboveOneKeepsTheFasterRetiming) {
  double gemm = 100.0;
  int left = 3;
  EXPECT_DOUBLE_EQ(step_mfu(150.0, gemm, left, [] { return 200.0; }), 0.75);
  EXPECT_DOUBLE_EQ(gemm, 200.0);
  EXPECT_EQ(left, 2);
  // A slower re-timing leaves the rate as it was.
  EXPECT_DOUBLE_EQ(step_mfu(300.0, gemm, left, [] { return 120.0; }), 1.5);
  EXPECT_DOUBLE_EQ(gemm, 200.0);
  EXPECT_EQ(left, 1);
}

TEST(StepMfu, RetimesAtMostTheAllowedNumberOfTimes) {
  double gemm = 100.0;
  int left = 2, calls = 0;
  for (int i = 0; i < 5; ++i) step_mfu(500.0, gemm, left, [&] { return ++calls, 110.0 + calls; });
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(left, 0);
  EXPECT_DOUBLE_EQ(gemm, 112.0);
}

}  // namespace
