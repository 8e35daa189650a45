// The family table (model/families.h): lookups, each row consistent with the tensor names it
// chooses, the per-layer windows the families fill from config.json, and docs/families.md being
// the generated page.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "core/error.h"
#include "model/families.h"
#include "model/hf_config.h"
#include "model/hf_names.h"
#include "model/params.h"
#include "model_testing.h"

namespace longtron::model {
namespace {

TEST(Families, LookupByModelTypeAndErrorListingThem) {
  EXPECT_EQ(family_list(), "internlm2, llama, qwen2, mistral, qwen3");
  EXPECT_EQ(std::string(family("qwen2", "model.type").architecture), "Qwen2ForCausalLM");
  EXPECT_EQ(find_family("gpt2"), nullptr);
  try {
    family("gpt2", "model.type");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "model.type = \"gpt2\": unsupported model type (supported: internlm2, "
                           "llama, qwen2, mistral, qwen3)");
  }
  EXPECT_STREQ(names_family(TensorNames::kFused), "internlm2");
  EXPECT_STREQ(names_family(TensorNames::kSeparate), "llama");
  EXPECT_EQ(or_list(window_families(), true), "\"mistral\", \"qwen2\" or \"qwen3\"");
}

// Each row's LoRA targets are exactly the block linears of its tensor names, in block order.
TEST(Families, LoraTargetsAreTheLinearsOfTheNames) {
  for (const Family& f : families()) {
    ModelConfig c = testing::tiny_config();
    c.type = f.model_type;
    c.qkv_bias = f.block.biases == BiasKeys::kQkvOnly;
    const ParamTable layout(c);
    std::vector<std::string> linears;
    for (const HfTensor& t : hf_tensors(layout)) {
      const BlockParamIds& b = layout.layers[0];
      const bool linear = t.view == b.wqkv || t.view == b.wo || t.view == b.w1 ||
                          t.view == b.w3 || t.view == b.w2;
      if (!linear || t.name.find(".weight") == std::string::npos) continue;
      const std::string module = t.name.substr(0, t.name.size() - 7);
      linears.push_back(module.substr(module.rfind('.') + 1));
    }
    const std::vector<std::string> targets(f.lora_targets.begin(), f.lora_targets.end());
    EXPECT_EQ(linears, targets) << f.model_type;
  }
}

// Writing as another family drops every family's own keys: the union is the list it was.
TEST(Families, FamilyKeysAreTheBiasAndWindowKeys) {
  std::set<std::string> keys;
  for (const Family& f : families())
    for (const char* k : family_keys(f)) keys.insert(k);
  EXPECT_EQ(keys, (std::set<std::string>{"bias", "qkv_bias", "o_bias", "attention_bias", "mlp_bias",
                                         "use_sliding_window", "max_window_layers",
                                         "sliding_window"}));
}

// Qwen2 slides from max_window_layers on, Mistral everywhere; a Qwen2 window beyond the last layer
// covers none and is written back as read.
TEST(Families, WindowsArePerLayer) {
  nlohmann::json q = {{"model_type", "qwen2"}, {"hidden_size", 16}, {"intermediate_size", 48},
                      {"num_hidden_layers", 3}, {"num_attention_heads", 4},
                      {"num_key_value_heads", 2}, {"vocab_size", 32},
                      {"use_sliding_window", true}, {"sliding_window", 5},
                      {"max_window_layers", 1}};
  ModelConfig c = from_hf_config(q, "q");
  EXPECT_EQ(c.window_layers, (std::vector<bool>{false, true, true}));
  EXPECT_EQ(c.window_of(0), 0);
  EXPECT_EQ(c.window_of(2), 5);
  EXPECT_EQ(c.windowed_layers(), 2);
  EXPECT_EQ(to_hf_config(c)["max_window_layers"], 1);
  q["max_window_layers"] = 28;
  c = from_hf_config(q, "q");
  EXPECT_EQ(c.windowed_layers(), 0);
  EXPECT_EQ(to_hf_config(c)["max_window_layers"], 28);
  q.erase("max_window_layers");  // Qwen2Config's default, 28
  EXPECT_EQ(to_hf_config(from_hf_config(q, "q"))["max_window_layers"], 28);
  q["max_window_layers"] = 0;
  c = from_hf_config(q, "q");
  EXPECT_EQ(c.windowed_layers(), 3);
  EXPECT_EQ(to_hf_config(c)["max_window_layers"], 0);
  nlohmann::json m = q;
  m["model_type"] = "mistral";
  m.erase("use_sliding_window");
  m.erase("max_window_layers");
  EXPECT_EQ(from_hf_config(m, "m").windowed_layers(), 3);
  EXPECT_EQ(window_layers_from(3, 2), (std::vector<bool>{false, false, true}));
}

TEST(Families, CommittedDocsPageIsTheGeneratedOne) {
  const std::string path = std::string(LONGTRON_SOURCE_DIR) + "/docs/families.md";
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << path << " is missing: run `build/longtron config --families-markdown > "
                         << "docs/families.md` (or `cmake --build build --target config_docs`)";
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_TRUE(text.str() == families_markdown())
      << "docs/families.md is out of date with src/model/families.cpp: regenerate it with "
         "`build/longtron config --families-markdown > docs/families.md` (or `cmake --build build "
         "--target config_docs`)";
}

}  // namespace
}  // namespace longtron::model
