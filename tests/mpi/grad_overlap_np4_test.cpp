// 4 ranks: the data-parallel gradient all-reduce overlapped with backward where a part of the
// gradient takes a tensor-parallel SUM first (dp2×tp2 MSP: the norm weights under sequence
// parallel, reduced after backward) and under ISP with W = 2 (its WEIGHT_DATA group of 2), bitwise
// against the reduction after backward; groups of 4 do not overlap (grad_overlap_cases.h).
#include "grad_overlap_cases.h"

namespace longtron::testing {
namespace {

using parallel::TensorMode;

TEST(GradOverlapNp4, Dp2Tp2MspIsBitwiseTheReductionAfterBackward) {
  check_overlap_bitwise({"dp2 tp2 msp", layout(2, TensorMode::kMsp), tiny_model(), 16, 4, 2}, false,
                        true);
}

// ISP over 2 sequence ranks with weights sharded over 2 (W = 2): the weight gradients are summed
// over WEIGHT_DATA, 2 ranks, during backward.
TEST(GradOverlapNp4, Isp2Weight2IsBitwiseTheReductionAfterBackward) {
  parallel::Layout l = layout(2, TensorMode::kIsp);
  l.weight_size = 2;
  check_overlap_bitwise({"isp2 weight2", l, tiny_model(), 16, 4, 2}, false, true);
}

// ISP with unsharded weights: WEIGHT_DATA is all 4 ranks, so the reduction stays after backward.
TEST(GradOverlapNp4, Isp2OverFourRanksReducesAfterBackward) {
  check_overlap_bitwise({"dp2 isp2", layout(2, TensorMode::kIsp), tiny_model(), 16, 4, 2}, false,
                        false);
}

TEST(GradOverlapNp4, Dp4ReducesAfterBackward) {
  check_overlap_bitwise({"dp4", layout(1, TensorMode::kMtp), tiny_model(), 16, 4, 2}, false, false);
}

}  // namespace
}  // namespace longtron::testing
