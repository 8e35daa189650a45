// main() for the tests/mpi/*_np<N>_test.cpp executables: starts MPI through comm::init, runs the
// GoogleTest cases on every rank, and fails the job if any rank failed. Tests are written so every
// rank takes the same path through collectives (EXPECT_*, not ASSERT_*, around collectives).
#pragma once
#include <gtest/gtest.h>

#include <cstdio>

#include "comm/communicator.h"

namespace longtron::testing {
/// The world communicator of the test job (set by main).
inline comm::CommPtr& world() {
  static comm::CommPtr w;
  return w;
}
}  // namespace longtron::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto& world = longtron::testing::world();
  world = longtron::comm::init(argc, argv);
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int64_t any = failed;
  world->all_reduce(&any, 1);
  if (world->rank() == 0)
    std::printf("[mpi] %d ranks, %lld rank(s) failed\n", world->size(), (long long)any);
  world.reset();
  longtron::comm::finalize();
  return any != 0 ? 1 : 0;
}
