// generate's sampling options are checked before any model is read: --temperature must be a
// finite number >= 0 (0 = greedy; NaN, inf and negative values are refused, as --top-p nan is).
#include <gtest/gtest.h>

#include <string>

#include "cli_fixture.h"
#include "test_util.h"

using longtron::testing::contains;
using longtron::testing::run_longtron;

TEST(GenerateArgs, TemperatureMustBeFiniteAndNonNegative) {
  for (const std::string t : {"nan", "inf", "-inf", "-1", "-0.5"}) {
    const auto r = run_longtron("generate --checkpoint /nonexistent --prompt hi --temperature " + t);
    EXPECT_EQ(r.status, 1) << t << ": " << r.output;
    EXPECT_TRUE(contains(r.output, "--temperature must be a finite number >= 0 (0 = greedy)"))
        << t << ": " << r.output;
  }
  for (const std::string t : {"0", "0.8"}) {  // accepted: the error is then the missing checkpoint
    const auto r = run_longtron("generate --checkpoint /nonexistent --prompt hi --temperature " + t);
    EXPECT_NE(r.status, 0);
    EXPECT_FALSE(contains(r.output, "--temperature")) << t << ": " << r.output;
    EXPECT_TRUE(contains(r.output, "/nonexistent")) << t << ": " << r.output;
  }
  const auto r = run_longtron("generate --checkpoint /nonexistent --prompt hi --top-p nan");
  EXPECT_TRUE(contains(r.output, "--top-p must be in (0, 1]")) << r.output;
}
