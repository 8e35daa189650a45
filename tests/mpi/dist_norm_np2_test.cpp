// Distributed RMSNorm / LayerNorm on 2 ranks: features split over both (y2), and tokens split
// over both with features whole (x2: the norms must then need no communication).
#include "dist_norm_cases.h"

#include "comm/process_grid.h"
#include "core/error.h"

namespace longtron::testing {
namespace {

TEST(DistNormNp2, FeaturesSplit) {
  auto self = world()->split(world()->rank(), 0);
  check_random_shapes(*self, *world(), 11);
}

TEST(DistNormNp2, TokensSplit) {
  auto self = world()->split(world()->rank(), 0);
  check_random_shapes(*world(), *self, 21);
}

TEST(DistNormNp2, WrongSplitIsAnError) {
  std::vector<float> x(6), w(3), o(6), r(2);
  EXPECT_THROW(parallel::dist_rms_norm_forward(o.data(), r.data(), x.data(), w.data(), 2, 3, 7,
                                               1e-5f, *world()),
               Error);
}

}  // namespace
}  // namespace longtron::testing
