// model::balance_cost: data.balance's row cost from the model's FLOP count, checked against
// model_flops (the MFU numerator) on a row: a·tokens + b·Σ l(l+1)/2 equals model_flops(tokens,
// Σ l²) plus the 6·layers·hidden·Σ l of the causal diagonal. With a sliding window only the
// visible pairs count, in the layers the window applies to.
#include <gtest/gtest.h>

#include <vector>

#include "model/decoder.h"

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

TEST(BalanceCost, CountsOnlyTheWindowsVisiblePairs) {
  ModelConfig c;
  c.hidden_size = 64;
  c.num_layers = 2;
  c.num_attention_heads = 4;
  c.type = "mistral";
  c.sliding_window = 4;
  const std::vector<int32_t> cu = {0, 10, 13};  // a document of 10 > window, one of 3 <= window
  data::RowCost cost = balance_cost(c);
  cost.per_token = 0.0;
  cost.per_pair = 1.0;
  // l = 10, window 4: 4·5/2 + 6·4 = 34 visible pairs (of 55); l = 3: all 6.
  EXPECT_DOUBLE_EQ(cost.of(cu), 34.0 + 6.0);
  c.type = "qwen2";
  c.window_layers = {false, true};  // layer 0 full (55 + 6), layer 1 windowed (34 + 6): mean 50.5
  cost = balance_cost(c);
  EXPECT_DOUBLE_EQ(cost.of(cu) - cost.per_token * 13, cost.per_pair * 50.5);
  c.sliding_window = 0;  // no window: every causal pair
  cost = balance_cost(c);
  EXPECT_DOUBLE_EQ(cost.of(cu) - cost.per_token * 13, cost.per_pair * 61.0);
  // Documents no longer than the window: the window changes nothing.
  c.sliding_window = 16;
  EXPECT_DOUBLE_EQ(balance_cost(c).of(cu), cost.of(cu));
}

}  // namespace
}  // namespace longtron::model
