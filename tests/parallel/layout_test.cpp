// Process-grid arithmetic without MPI: the groups of several layouts on 8 ranks, and the layout and
// model-size errors (each naming its constraint).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "modes/engine.h"
#include "parallel/layout.h"

namespace longtron::parallel {
namespace {

using comm::Group;
using V = std::vector<int>;

TEST(ProcessGrid, TensorConsecutiveDataStrided) {
  Layout l{.tensor_size = 2, .tensor_mode = TensorMode::kMsp};
  EXPECT_EQ(group_ranks(l, 8, Group::kTensor, 5), (V{4, 5}));
  EXPECT_EQ(group_ranks(l, 8, Group::kData, 5), (V{1, 3, 5, 7}));
  EXPECT_EQ(group_ranks(l, 8, Group::kWeight, 5), (V{5}));
  EXPECT_EQ(group_ranks(l, 8, Group::kWeightData, 5), (V{1, 3, 5, 7}));  // = DATA outside isp
  EXPECT_EQ(group_ranks(l, 8, Group::kX, 5), (V{5}));
}

TEST(ProcessGrid, Zero1InsideTheDataGroup) {
  Layout l{.tensor_size = 2, .zero1_size = 2};
  EXPECT_EQ(group_ranks(l, 8, Group::kZero1, 5), (V{5, 7}));
  EXPECT_EQ(group_ranks(l, 8, Group::kZero1Replica, 5), (V{1, 5}));
  l.zero1_size = -1;
  EXPECT_EQ(group_ranks(l, 8, Group::kZero1, 5), (V{1, 3, 5, 7}));
  EXPECT_EQ(group_ranks(l, 8, Group::kZero1Replica, 5), (V{5}));
  l.zero1_size = 1;
  EXPECT_EQ(group_ranks(l, 8, Group::kZero1, 5), (V{5}));
  EXPECT_EQ(group_ranks(l, 8, Group::kZero1Replica, 5), (V{1, 3, 5, 7}));
}

TEST(ProcessGrid, IspWeightAndWeightDataGroups) {
  // InternEvo: WEIGHT = W consecutive ranks, WEIGHT_DATA = same weight rank; ZeRO inside it.
  Layout l{.tensor_size = 2, .tensor_mode = TensorMode::kIsp, .weight_size = 4, .zero1_size = -1};
  EXPECT_EQ(group_ranks(l, 8, Group::kTensor, 6), (V{6, 7}));
  EXPECT_EQ(group_ranks(l, 8, Group::kData, 6), (V{0, 2, 4, 6}));
  EXPECT_EQ(group_ranks(l, 8, Group::kWeight, 6), (V{4, 5, 6, 7}));
  EXPECT_EQ(group_ranks(l, 8, Group::kWeightData, 6), (V{2, 6}));
  EXPECT_EQ(group_ranks(l, 8, Group::kZero1, 6), (V{2, 6}));
}

TEST(ProcessGrid, TwoDimensionalXConsecutiveYStrided) {
  Layout l{.tensor_2d_x = 2, .tensor_2d_y = 2};
  EXPECT_EQ(l.tp(), 4);
  // rank 6: tensor block {4..7}, local rank 2 → x_rank 0, y_rank 1.
  EXPECT_EQ(group_ranks(l, 8, Group::kTensor, 6), (V{4, 5, 6, 7}));
  EXPECT_EQ(group_ranks(l, 8, Group::kX, 6), (V{6, 7}));
  EXPECT_EQ(group_ranks(l, 8, Group::kY, 6), (V{4, 6}));
  EXPECT_EQ(group_ranks(l, 8, Group::kData, 6), (V{2, 6}));
  Layout l2{.tensor_2d_x = 1, .tensor_2d_y = 4};
  EXPECT_EQ(group_ranks(l2, 8, Group::kX, 6), (V{6}));
  EXPECT_EQ(group_ranks(l2, 8, Group::kY, 6), (V{4, 5, 6, 7}));
}

// The error message of validate_* must contain `needle`.
template <typename F>
void expect_error(F f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing: " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(ProcessGrid, LayoutErrorsNameTheConstraint) {
  expect_error([] { validate_layout(Layout{.tensor_size = 4}, 6); }, "not divisible by the tensor-parallel size 4");
  expect_error([] { validate_layout(Layout{.tensor_size = 2, .weight_size = 2}, 4); }, "needs parallel.tensor.mode = \"isp\"");
  expect_error([] { validate_layout(Layout{.tensor_size = 2, .tensor_2d_x = 2, .tensor_2d_y = 1}, 4); }, "cannot be used together");
  expect_error([] { validate_layout(Layout{.zero1_size = 3}, 4); }, "parallel.zero1.size 3 does not divide");
  expect_error([] { validate_layout(Layout{.zero1_size = 0}, 4); }, "parallel.zero1.size must be");
  expect_error([] { validate_layout(Layout{.tensor_size = 2, .tensor_mode = TensorMode::kIsp, .weight_size = 3}, 4); }, "parallel.weight.size 3");
  expect_error([] { parse_tensor_mode("tp"); }, "parallel.tensor.mode = \"tp\"");
  EXPECT_NO_THROW(validate_layout(Layout{.tensor_size = 2, .tensor_mode = TensorMode::kIsp, .weight_size = 4, .zero1_size = -1}, 8));
}

TEST(ProcessGrid, ModelErrorsNameTheConstraint) {
  ModelShape s{.num_heads = 8, .num_kv_heads = 2, .hidden_size = 64, .packed_length = 30};
  Layout tp4{.tensor_size = 4};
  expect_error([&] { validate_model_layout(tp4, 4, s); }, "num_kv_attention_heads (2) is not divisible by parallel.tensor.size (4)");
  Layout msp2{.tensor_size = 2, .tensor_mode = TensorMode::kMsp};
  ModelShape odd = s;
  odd.packed_length = 31;
  expect_error([&] { validate_model_layout(msp2, 2, odd); }, "packed row length P (31)");
  EXPECT_NO_THROW(validate_model_layout(Layout{.tensor_size = 2}, 2, odd));  // mtp keeps full rows
  Layout isp4{.tensor_size = 4, .tensor_mode = TensorMode::kIsp, .weight_size = 4};
  ModelShape isp = s;
  isp.packed_length = 32;
  EXPECT_NO_THROW(validate_model_layout(isp4, 4, isp));  // kv heads repeated
  Layout isp8{.tensor_size = 8, .tensor_mode = TensorMode::kIsp};
  ModelShape three = isp;
  three.num_kv_heads = 4;
  three.num_heads = 12;
  expect_error([&] { validate_model_layout(isp8, 8, three); }, "num_attention_heads (12) is not divisible");
  Layout d2{.tensor_2d_x = 2, .tensor_2d_y = 2};
  ModelShape h = isp;
  h.num_heads = 4;  // kv heads per x rank 1 < y 2: repeated, accepted
  EXPECT_NO_THROW(validate_model_layout(d2, 4, h));
  h.num_heads = 24;
  h.num_kv_heads = 6;
  expect_error([&] { validate_model_layout(Layout{.tensor_2d_x = 2, .tensor_2d_y = 4}, 8, h); },
               "kv heads per x rank (3) and parallel.tensor_2d.y (4)");
  h.num_heads = 6;
  h.num_kv_heads = 6;
  expect_error([&] { validate_model_layout(d2, 4, h); }, "attention heads per x rank (3) is not divisible by parallel.tensor_2d.y (2)");
}

}  // namespace
}  // namespace longtron::parallel
