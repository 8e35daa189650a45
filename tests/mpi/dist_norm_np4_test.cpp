// Distributed RMSNorm / LayerNorm on 4 ranks: the 2D TP grid x2 × y2 (tokens over x, features over
// y, weight gradients summed over x), and features split over all 4.
#include "dist_norm_cases.h"

#include "parallel/layout.h"

namespace longtron::testing {
namespace {

TEST(DistNormNp4, Grid2x2) {
  parallel::Layout l;
  l.tensor_2d_x = 2, l.tensor_2d_y = 2;
  parallel::Grid grid = parallel::make_grid(world(), l);
  check_random_shapes(*grid.x, *grid.y, 31);
}

TEST(DistNormNp4, FeaturesSplit4) {
  auto self = world()->split(world()->rank(), 0);
  check_random_shapes(*self, *world(), 41);
}

}  // namespace
}  // namespace longtron::testing
