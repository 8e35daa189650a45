// 4 ranks: the data-parallel gradient all-reduce overlapped with backward where a part of the
// gradient takes a tensor-parallel SUM first (dp2×tp2 MSP: the norm weights under sequence
// parallel, reduced after backward) and under ISP with W = 2 (its WEIGHT_DATA group of 2), bitwise
// against the reduction after backward; groups of 4 do not overlap (grad_overlap_cases.h). The
// same for ZeRO-1's reduce-scatter: dp4 with zero1 groups of 2 (reduce-scatter over 2, then the
// slice all-reduced over the 2 replicas, bucket by bucket), dp2×tp2 MSP, ISP W = 2, 2D x2 y1 with
// dp2, LoRA over dp2×tp2; a zero1 group of 4 reduce-scatters after backward.
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

TEST(GradOverlapNp4, Dp4Zero1Of2IsBitwiseTheReductionAfterBackward) {
  check_overlap_bitwise({"dp4 zero1=2", layout(1, TensorMode::kMtp, 2), tiny_model(), 16, 4, 2},
                        false, true);
}

TEST(GradOverlapNp4, Dp4Zero1Of4ReducesAfterBackward) {
  check_overlap_bitwise({"dp4 zero1", layout(1, TensorMode::kMtp, -1), tiny_model(), 16, 4, 2},
                        false, false);
}

TEST(GradOverlapNp4, Dp2Tp2MspZero1IsBitwiseTheReductionAfterBackward) {
  check_overlap_bitwise({"dp2 tp2 msp zero1", layout(2, TensorMode::kMsp, -1), tiny_model(), 16, 4,
                         2}, false, true);
}

TEST(GradOverlapNp4, Isp2Weight2Zero1IsBitwiseTheReductionAfterBackward) {
  parallel::Layout l = layout(2, TensorMode::kIsp, -1);
  l.weight_size = 2;
  check_overlap_bitwise({"isp2 weight2 zero1", l, tiny_model(), 16, 4, 2}, true, true);
}

TEST(GradOverlapNp4, Dp2Tp2dX2Y1Zero1IsBitwiseTheReductionAfterBackward) {
  parallel::Layout l;
  l.tensor_2d_x = 2;
  l.tensor_2d_y = 1;
  l.zero1_size = -1;
  check_overlap_bitwise({"dp2 2d x2 y1 zero1", l, tiny_model(), 16, 4, 2}, false, true);
}

TEST(GradOverlapNp4, LoraDp2Mtp2Zero1IsBitwiseTheReductionAfterBackward) {
  check_overlap_bitwise({"lora dp2 mtp2 zero1", layout(2, TensorMode::kMtp, -1),
                         lora_model("llama"), 16, 4, 2}, false, true);
}

}  // namespace
}  // namespace longtron::testing
