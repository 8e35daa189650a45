// Parameter layout (names, shapes, count), the InternEvo init, and the FLOPs formula.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "model/decoder.h"
#include "model/params.h"
#include "model_testing.h"

namespace longtron::model {
namespace {

/// configs/small.toml's model: vocab 8192, hidden 384, 6 layers, 6 heads, 2 kv heads, mlp 8/3.
ModelConfig small_config() {
  ModelConfig c;
  c.vocab_size = 8192;
  c.hidden_size = 384;
  c.num_layers = 6;
  c.num_attention_heads = 6;
  c.num_kv_attention_heads = 2;
  return c;
}

TEST(ModelParams, CountAndShapes) {
  const ParamTable layout(small_config());
  // By hand: d = 64, Q = (6 + 2·2)·64 = 640, F = 256·ceil(1024/256) = 1024.
  // Per layer: 384 + 640·384 + 384·384 + 384 + 3·1024·384 = 1,573,632; ×6 = 9,441,792;
  // embedding and head 8192·384 = 3,145,728 each; final norm 384 → 15,733,632.
  EXPECT_EQ(layout.numel(), 15733632);
  EXPECT_EQ(layout.views().size(), 2u + 1u + 6u * 7u);
  EXPECT_EQ(layout.matmul_numel(), 6 * (640 * 384 + 384 * 384 + 3 * 1024 * 384) + 8192 * 384);
  EXPECT_EQ(layout.views().front().name, "model.tok_embeddings.weight");
  EXPECT_EQ(layout.views().back().name, "output.weight");
  const ParamView& wqkv = layout.at("model.layers.5.attention.wqkv.weight");
  EXPECT_EQ(wqkv.shape, (std::vector<int64_t>{640, 384}));
  EXPECT_EQ(layout.at("model.layers.0.feed_forward.w2.weight").shape,
            (std::vector<int64_t>{384, 1024}));
  EXPECT_TRUE(layout.at("model.layers.2.ffn_norm.weight").is_norm);
  EXPECT_FALSE(layout.at("model.norm.weight").is_matrix);
  EXPECT_TRUE(layout.at("output.weight").is_matrix);
  int64_t offset = 0;  // views tile the buffer in order
  for (const auto& v : layout.views()) {
    EXPECT_EQ(v.offset, offset) << v.name;
    offset += v.numel;
  }
  EXPECT_EQ(layout.find("model.layers.6.attention.wo.weight"), -1);
  EXPECT_THROW(layout.at("nope"), longtron::Error);
}

TEST(ModelParams, BiasesAppearWhenConfigured) {
  ModelConfig c = testing::tiny_config();
  c.qkv_bias = true;
  c.o_bias = true;
  const ParamTable layout(c);
  EXPECT_EQ(layout.at("model.layers.1.attention.wqkv.bias").shape, (std::vector<int64_t>{32}));
  EXPECT_TRUE(layout.at("model.layers.1.attention.wo.bias").is_bias);
  EXPECT_FALSE(layout.at("model.layers.1.attention.wo.bias").is_matrix);
}

TEST(ModelParams, ImpossibleShapesNameTheKey) {
  ModelConfig c = testing::tiny_config();
  c.num_kv_attention_heads = 3;
  try {
    ParamTable layout(c);
    FAIL() << "expected an error";
  } catch (const longtron::Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.num_kv_attention_heads"), std::string::npos);
  }
  c = testing::tiny_config();
  c.vocab_size = 0;
  EXPECT_THROW(ParamTable{c}, longtron::Error);
}

// Typo-sized shapes are refused by name before any size arithmetic can overflow 64 bits (a
// num_layers of 2^63 - 1 once became -1 layers and crashed).
TEST(ModelParams, HugeShapesAreRefusedByName) {
  auto expect_refused = [](ModelConfig c, const std::string& key) {
    try {
      ParamTable layout(c);
      ADD_FAILURE() << "no error for " << key;
    } catch (const longtron::Error& e) {
      EXPECT_NE(std::string(e.what()).find("model." + key), std::string::npos) << e.what();
    }
  };
  ModelConfig c = testing::tiny_config();
  c.num_layers = INT64_MAX;
  expect_refused(c, "num_layers");
  c = testing::tiny_config();
  c.multiple_of = INT64_MAX;
  expect_refused(c, "multiple_of");
  c = testing::tiny_config();
  c.vocab_size = INT64_MAX;
  expect_refused(c, "vocab_size");
  c = testing::tiny_config();
  c.mlp_ratio = 1e300;
  expect_refused(c, "mlp_ratio");
  c = testing::tiny_config();
  c.mlp_ratio = INFINITY;
  expect_refused(c, "mlp_ratio");
  c = testing::tiny_config();
  c.hidden_size = int64_t{1} << 30;  // each width fits, the parameter count does not
  c.num_attention_heads = 2;
  c.num_kv_attention_heads = 2;
  expect_refused(c, "hidden_size");
  c = testing::tiny_config();
  c.num_layers = 65536;  // the largest accepted
  EXPECT_NO_THROW(check_model_limits(c));
}

TEST(ModelParams, InitStatistics) {
  const ParamTable layout(small_config());
  Params<float> p(layout);
  init_params(p, 42);
  for (const auto& v : layout.views()) {
    const float* x = p.data() + v.offset;
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < v.numel; ++i) s += x[i], s2 += double(x[i]) * x[i];
    const double mean = s / double(v.numel), sd = std::sqrt(s2 / double(v.numel) - mean * mean);
    if (v.is_norm) {
      EXPECT_EQ(mean, 1.0) << v.name;
      EXPECT_EQ(sd, 0.0) << v.name;
      continue;
    }
    double expect_sd = 0.02;
    if (v.name.ends_with("wo.weight") || v.name.ends_with("w2.weight"))
      expect_sd = 0.02 / std::sqrt(2.0 * (v.layer + 1));
    EXPECT_NEAR(sd, expect_sd, 0.02 * expect_sd) << v.name;  // ≥ 147k samples: ~0.2% noise
    EXPECT_NEAR(mean, 0.0, 0.02 * expect_sd) << v.name;
  }
}

TEST(ModelParams, InitIsReproducibleAndPerTensor) {
  ModelConfig c = testing::tiny_config();
  const ParamTable a(c);
  Params<double> pa(a), pb(a), pc(a);
  init_params(pa, 7);
  init_params(pb, 7);
  init_params(pc, 8);
  EXPECT_EQ(std::vector<double>(pa.data(), pa.data() + pa.numel()),
            std::vector<double>(pb.data(), pb.data() + pb.numel()));
  EXPECT_NE(pa.data()[0], pc.data()[0]);
  // A tensor's values depend only on (seed, its index): the embedding and layer 0 are the same
  // in a deeper model.
  c.num_layers = 5;
  const ParamTable deep(c);
  Params<double> pd(deep);
  init_params(pd, 7);
  const int64_t upto = a.at("model.layers.1.attention_norm.weight").offset;
  for (int64_t i = 0; i < upto; ++i) ASSERT_EQ(pa.data()[i], pd.data()[i]) << i;
  // float and double draw the same normals (rounded).
  Params<float> pf(a);
  init_params(pf, 7);
  for (int64_t i = 0; i < pa.numel(); ++i) ASSERT_EQ(pf.data()[i], static_cast<float>(pa.data()[i]));
}

TEST(ModelFlops, HandComputedExample) {
  // Tiny config: matmul parameters per layer = Q·H + H·H + 3·F·H = 32·16 + 256 + 3·48·16 = 3072,
  // ×2 layers + head 32·16 = 6656. Row of 24 tokens with segments 7,1,5,1,6,4:
  // Σ l² = 49+1+25+1+36+16 = 128. FLOPs = 6·6656·24 + 6·2·16·128 = 958,464 + 24,576 = 983,040.
  const ModelConfig c = testing::tiny_config();
  const std::vector<int32_t> cu = {0, 7, 8, 13, 14, 20, 24};
  EXPECT_EQ(sum_squared_segments(cu), 128.0);
  EXPECT_EQ(model_flops(c, 24, 128.0), 983040.0);
  EXPECT_EQ(ParamTable(c).matmul_numel(), 6656);
}

TEST(ModelFlops, WindowCountsOnlyVisiblePairs) {
  // Window 4 in layer 1 only (layer 0 full). Segments 7, 5 and 6 are longer than 4: visible pairs
  // 4·5/2 + (7−4)·4 = 22 of 28, 10 + 4 = 14 of 15 and 10 + 2·4 = 18 of 21. Σ over layers / 2:
  // 49·(1 + 22/28)/2 + 1 + 25·(1 + 14/15)/2 + 1 + 36·(1 + 18/21)/2 + 16.
  ModelConfig c = testing::tiny_config();
  c.sliding_window = 4;
  c.window_layers = {false, true};  // layer 1 only
  const std::vector<int32_t> cu = {0, 7, 8, 13, 14, 20, 24};
  const double expected =
      49.0 * (1 + 22.0 / 28) / 2 + 1 + 25.0 * (1 + 14.0 / 15) / 2 + 1 + 36.0 * (1 + 18.0 / 21) / 2 + 16;
  EXPECT_DOUBLE_EQ(sum_squared_segments(c, cu), expected);
  c.sliding_window = 7;  // no segment is longer: every pair counts
  EXPECT_EQ(sum_squared_segments(c, cu), 128.0);
}

}  // namespace
}  // namespace longtron::model
