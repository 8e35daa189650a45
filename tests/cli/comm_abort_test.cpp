// A rank that throws (or dies) ends the whole mpirun job within seconds with that rank's error,
// while the other ranks are blocked in a collective; it never hangs (`longtron comm-check`).
#include <gtest/gtest.h>

#include <chrono>

#include "test_util.h"

namespace longtron::testing {
namespace {

// Runs `longtron comm-check <args>` on `np` ranks; `timeout` guards the test against a hang.
CommandResult run_mpi(int np, const std::string& args, double* seconds) {
  auto start = std::chrono::steady_clock::now();
  CommandResult r = run_command("OMP_NUM_THREADS=1 timeout 30 mpirun -np " + std::to_string(np) +
                                " --oversubscribe --allow-run-as-root --bind-to none " +
                                LONGTRON_BINARY + " comm-check " + args);
  *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

TEST(CommAbort, HealthyJobPasses) {
  double s = 0;
  CommandResult r = run_mpi(2, "", &s);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("comm-check: 2 rank(s) ok"), std::string::npos) << r.output;
}

TEST(CommAbort, ThrowingRankEndsTheJobWithItsError) {
  double s = 0;
  CommandResult r = run_mpi(2, "--throw-rank 1", &s);
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.status, 124) << "timed out (hang): " << r.output;
  EXPECT_NE(r.output.find("longtron: rank 1: error: comm-check: rank 1 throws"), std::string::npos)
      << r.output;
  EXPECT_LT(s, 10.0) << r.output;
}

TEST(CommAbort, ExitingRankEndsTheJob) {
  double s = 0;
  CommandResult r = run_mpi(2, "--exit-rank 0", &s);
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.status, 124) << "timed out (hang): " << r.output;
  EXPECT_LT(s, 10.0) << r.output;
}

TEST(CommAbort, WithoutMpirunItIsOneRank) {
  CommandResult r = run_longtron("comm-check");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("comm-check: 1 rank(s) ok"), std::string::npos) << r.output;
  r = run_longtron("comm-check --throw-rank 0");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("longtron: error: comm-check: rank 0 throws"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace longtron::testing
