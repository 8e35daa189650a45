#include "ops/threads.h"

#include <gtest/gtest.h>

namespace lt = longtron;

TEST(Threads, AutoDividesCoresAmongRanks) {
  const int hw = lt::hardware_threads();
  EXPECT_EQ(lt::set_num_threads(0, 1), hw);
  EXPECT_EQ(lt::set_num_threads(0, hw * 4), 1);
  EXPECT_EQ(lt::set_num_threads(3), 3);
  EXPECT_EQ(lt::num_threads(), 3);
}
