#include <gtest/gtest.h>

#include <filesystem>

#include "core/atomic_file.h"
#include "core/error.h"
#include "test_util.h"

namespace lt = longtron;

TEST(AtomicFile, FailureLeavesNothingBehind) {
  lt::testing::TempDir dir;
  auto target = dir / "out";
  EXPECT_THROW(lt::write_atomically(target,
                                    [](const std::filesystem::path& tmp) {
                                      lt::testing::write_file(tmp, "partial");
                                      lt::fail("disk full at byte {}", 7);
                                    }),
               lt::Error);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
  lt::write_atomically(target, [](const auto& tmp) { lt::testing::write_file(tmp, "whole"); });
  EXPECT_EQ(lt::testing::read_file(target), "whole");
}
