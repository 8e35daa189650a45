// model::balance_cost: data.balance's row cost from the model's FLOP count, checked against
// model_flops (the MFU numerator) on a row: a·tokens + b·Σ l(l+1)/2 equals model_flops(tokens,
// Σ l²) plus the 6·layers·hidden·Σ l of the causal diagonal.
#include <gtest/gtest.h>

#include <vector>

#include "model/internlm2.h"

namespace longtron::model {
namespace {

TEST(BalanceCost, FollowsModelFlops) {
  ModelConfig c;
  c.vocab_size = 1000;
  c.hidden_size = 64;
  c.num_layers = 3;
  c.num_attention_heads = 4;
  c.num_kv_attention_heads = 2;
  c.multiple_of = 32;
  const data::RowCost cost = balance_cost(c);
  const std::vector<int32_t> cu = {0, 100, 1124, 1200, 2048};
  const double flops = model_flops(c, 2048, sum_squared_segments(cu));
  const double diagonal = 6.0 * 3 * 64 * 2048;
  EXPECT_NEAR(cost.of(cu), flops + diagonal, 1e-9 * flops);
  EXPECT_DOUBLE_EQ(cost.per_pair, 12.0 * 3 * 64);
  EXPECT_DOUBLE_EQ(cost.per_token, model_flops(c, 1, 0.0));
}

}  // namespace
}  // namespace longtron::model
