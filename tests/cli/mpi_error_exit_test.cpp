// An error that every rank of an mpirun job sees (a config check, a non-empty checkpoint folder)
// ends the job with one message from rank 0 and a non-zero status, after MPI_Finalize: no
// MPI_Abort and none of Open MPI's abort noise (comm::run_on_world).
#include <gtest/gtest.h>

#include "cli_fixture.h"

namespace {

using longtron::testing::contains;
using longtron::testing::mpirun_longtron;
using longtron::testing::Prepared;

/// How often `part` occurs in `text`.
size_t count_of(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

/// The text of an MPI_Abort (Open MPI's abort report and its show_help failure).
void expect_no_abort_noise(const std::string& output) {
  for (const char* noise : {"ORTE_ERROR_LOG", "show_help", "MPI_ABORT", "MPI_Abort"})
    EXPECT_FALSE(contains(output, noise)) << noise << " in:\n" << output;
}

TEST(MpiErrorExit, ConfigErrorOfEveryRankIsOneMessage) {
  Prepared p;
  const auto r = mpirun_longtron(2, "train" + p.config() + " --set train.total_steps=0");
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.status, 124) << "timed out: " << r.output;
  EXPECT_EQ(count_of(r.output, "must be > 0, got 0"), 1u) << r.output;
  EXPECT_TRUE(contains(r.output, "longtron: error: --set train.total_steps=0")) << r.output;
  expect_no_abort_noise(r.output);
}

// The README's `mpirun ... train` example run twice into the same train.checkpoint_dir.
TEST(MpiErrorExit, SecondRunIntoTheSameCheckpointFolderEndsCleanly) {
  Prepared p;
  const std::string args = "train" + p.config() + " --set train.total_steps=1";
  auto r = mpirun_longtron(2, args);
  ASSERT_EQ(r.status, 0) << r.output;
  r = mpirun_longtron(2, args);
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.status, 124) << "timed out: " << r.output;
  EXPECT_EQ(count_of(r.output, "is not empty (checkpoints of an earlier run?)"), 1u) << r.output;
  EXPECT_TRUE(contains(r.output, "longtron: error: train.checkpoint_dir = ")) << r.output;
  expect_no_abort_noise(r.output);
}

}  // namespace
