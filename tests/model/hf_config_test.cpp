// Hugging Face config.json ↔ ModelConfig (docs/model.md).
#include "expect_error.h"
#include "model/hf_config.h"

#include <gtest/gtest.h>

#include <cstdint>

#include "core/error.h"
#include "test_util.h"

using longtron::Error;
using longtron::model::ModelConfig;
namespace lm = longtron::model;

namespace {
ModelConfig demo() {
  ModelConfig c;
  c.vocab_size = 8192;
  c.hidden_size = 384;
  c.num_layers = 6;
  c.num_attention_heads = 6;
  c.num_kv_attention_heads = 2;
  return c;  // mlp_ratio 8/3, multiple_of 256 → ffn 1024
}

using longtron::testing::expect_error;
}  // namespace

TEST(HfConfig, WritesHfKeys) {
  const auto j = lm::to_hf_config(demo(), 512);
  EXPECT_EQ(j["architectures"][0], "InternLM2ForCausalLM");
  EXPECT_EQ(j["hidden_size"], 384);
  EXPECT_EQ(j["intermediate_size"], 1024);
  EXPECT_EQ(j["num_hidden_layers"], 6);
  EXPECT_EQ(j["num_attention_heads"], 6);
  EXPECT_EQ(j["num_key_value_heads"], 2);
  EXPECT_DOUBLE_EQ(j["rms_norm_eps"].get<double>(), 1e-5);
  EXPECT_DOUBLE_EQ(j["rope_theta"].get<double>(), 10000);
  EXPECT_EQ(j["vocab_size"], 8192);
  EXPECT_EQ(j["bias"], false);
  EXPECT_EQ(j["max_position_embeddings"], 512);
}

TEST(HfConfig, FileRoundTrip) {
  longtron::testing::TempDir dir;
  ModelConfig c = demo();
  c.norm_eps = 1e-6;
  c.rope_base = 1e6;
  c.qkv_bias = true;
  lm::write_hf_config(dir / "config.json", c);
  const ModelConfig r = lm::read_hf_config(dir.path());
  EXPECT_EQ(r.vocab_size, c.vocab_size);
  EXPECT_EQ(r.hidden_size, c.hidden_size);
  EXPECT_EQ(r.num_layers, c.num_layers);
  EXPECT_EQ(r.num_attention_heads, c.num_attention_heads);
  EXPECT_EQ(r.num_kv_attention_heads, c.num_kv_attention_heads);
  EXPECT_EQ(r.ffn_size(), 1024);
  EXPECT_EQ(r.multiple_of, 256);
  EXPECT_DOUBLE_EQ(r.norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(r.rope_base, 1e6);
  EXPECT_TRUE(r.qkv_bias);
  EXPECT_FALSE(r.o_bias);
}

TEST(HfConfig, DerivedMlpReproducesEveryIntermediateSize) {
  for (int64_t hidden : {64, 100, 384, 4096}) {
    for (int64_t inter = 1; inter <= 3000; ++inter) {
      const nlohmann::json j = {{"hidden_size", hidden}, {"intermediate_size", inter},
                                {"num_hidden_layers", 1}, {"num_attention_heads", 1},
                                {"vocab_size", 10}};
      const ModelConfig c = lm::from_hf_config(j, "c.json");
      ASSERT_EQ(c.ffn_size(), inter) << hidden << " " << inter;
      ASSERT_EQ(inter % c.multiple_of, 0);
    }
  }
  const nlohmann::json llama = {{"hidden_size", 4096}, {"intermediate_size", 11008},
                                {"num_hidden_layers", 1}, {"num_attention_heads", 32}, {"vocab_size", 10}};
  EXPECT_EQ(lm::from_hf_config(llama, "c").multiple_of, 256);
  EXPECT_EQ(lm::from_hf_config(llama, "c").num_kv_attention_heads, 32);  // absent → MHA
}

TEST(HfConfig, ErrorsNameTheKey) {
  nlohmann::json j = lm::to_hf_config(demo());
  j.erase("num_hidden_layers");
  expect_error([&] { lm::from_hf_config(j, "dir/config.json"); }, {"dir/config.json", "num_hidden_layers"});
  j = lm::to_hf_config(demo());
  j["hidden_size"] = "wide";
  expect_error([&] { lm::from_hf_config(j, "c.json"); }, {"hidden_size", "integer"});
  j = lm::to_hf_config(demo());
  j["architectures"] = {"LlamaForCausalLM"};
  expect_error([&] { lm::from_hf_config(j, "c.json"); }, {"LlamaForCausalLM"});
  // Values that parse but no model has: refused naming the file and config.json's own key (eval,
  // generate and export read a folder with no other check: rope_theta 0 gave a NaN loss).
  const std::pair<const char*, nlohmann::json> impossible[] = {
      {"num_hidden_layers", 0}, {"vocab_size", 0}, {"num_key_value_heads", 0},
      {"num_key_value_heads", 4}, {"rope_theta", 0}, {"rope_theta", -1.0}, {"rms_norm_eps", 0},
      // Beyond 64-bit size arithmetic: intermediate_size 2^63 - 1 made the ratio search loop
      // forever (2^63 converted back to int64), head_dim 2^62 overflowed head_dim x heads.
      {"intermediate_size", INT64_MAX}, {"hidden_size", int64_t{1} << 41},
      {"head_dim", int64_t{1} << 62}};
  for (const auto& [key, value] : impossible) {
    j = lm::to_hf_config(demo());
    j[key] = value;
    expect_error([&] { lm::from_hf_config(j, "hf/config.json"); }, {"hf/config.json", key});
  }
  longtron::testing::TempDir dir;
  expect_error([&] { lm::read_hf_config(dir.path()); }, {"config.json"});
  longtron::testing::write_file(dir / "config.json", "{oops");
  expect_error([&] { lm::read_hf_config(dir.path()); }, {"config.json", "JSON"});
}

TEST(HfConfig, MergeChecksGivenKeys) {
  const ModelConfig file = demo();
  ModelConfig toml = demo();
  toml.checkpoint = true;
  const auto ok = lm::merge_model_config(file, toml, {"hidden_size", "num_layers", "mlp_ratio"}, "hf/config.json");
  EXPECT_TRUE(ok.checkpoint);
  EXPECT_EQ(ok.hidden_size, 384);
  toml.hidden_size = 512;
  expect_error([&] { lm::merge_model_config(file, toml, {"hidden_size"}, "hf/config.json"); },
               {"model.hidden_size = 512", "hf/config.json", "hidden_size = 384"});
  EXPECT_NO_THROW(lm::merge_model_config(file, toml, {"num_layers"}, "x"));  // not given: ignored
  toml = demo();
  toml.num_layers = 2;
  expect_error([&] { lm::merge_model_config(file, toml, {"num_layers"}, "x"); },
               {"model.num_layers = 2", "num_hidden_layers = 6"});
  toml = demo();
  toml.multiple_of = 384;
  expect_error([&] { lm::merge_model_config(file, toml, {"multiple_of"}, "x"); },
               {"model.multiple_of = 384", "1152", "intermediate_size = 1024"});
  toml = demo();
  toml.num_kv_attention_heads = 6;
  expect_error([&] { lm::merge_model_config(file, toml, {"num_kv_attention_heads"}, "x"); },
               {"model.num_kv_attention_heads = 6", "num_key_value_heads = 2"});
}
