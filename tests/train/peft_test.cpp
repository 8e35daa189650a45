// PEFT adapter folders (docs/lora.md): round trip, PEFT's names and config fields, every refusal
// naming the file and tensor, the base fingerprint, the family module names, the exact conversion
// between InternLM2's fused wqkv adapter and Llama's q/k/v adapters, and merging W + s·B·A.
#include "train/peft.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <random>

#include "core/json_read.h"
#include "core/safetensors.h"
#include "expect_error.h"
#include "model/hf_names.h"
#include "model/lora.h"
#include "test_util.h"

using longtron::testing::expect_error;
using longtron::testing::TempDir;
namespace fs = std::filesystem;
namespace tr = longtron::train;
namespace st = longtron::safetensors;
namespace model = longtron::model;

namespace {

std::vector<float> random_values(size_t n, uint64_t seed, float scale = 0.5f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

tr::PeftModuleAdapter module(const std::string& name, int64_t in, int64_t out, int r, uint64_t seed) {
  return {name, in, out, random_values(size_t(r * in), seed), random_values(size_t(out * r), seed + 1)};
}

/// A model with grouped-query attention (4 query heads, 2 kv heads, head_dim 2) of family `type`.
model::ModelConfig tiny_config(const std::string& type) {
  model::ModelConfig c;
  c.type = type;
  c.vocab_size = 11;
  c.hidden_size = 8;
  c.num_layers = 2;
  c.num_attention_heads = 4;
  c.num_kv_attention_heads = 2;
  c.multiple_of = 4;
  return c;
}

/// Every linear of `layout` (model::lora_modules with "all-linear"), or those of `targets`.
std::vector<model::LoraModule> all_linears(const model::ParamTable& layout,
                                           std::vector<std::string> targets = {"all-linear"}) {
  model::LoraConfig c;
  c.rank = 1;
  c.targets = std::move(targets);
  return model::lora_modules(layout, c);
}

/// An adapter of every linear of `layout`, rank r.
tr::PeftAdapter full_adapter(const model::ParamTable& layout, int r, uint64_t seed) {
  tr::PeftAdapter a;
  a.config.r = r;
  a.config.lora_alpha = 16;
  a.config.target_modules = model::lora_family_targets(layout.config().type);
  for (const auto& m : all_linears(layout))
    a.modules.push_back(module(m.module, m.in, m.out, r, seed++ * 7));
  return a;
}

void write_adapter_files(const fs::path& dir, const nlohmann::json& config,
                         const std::vector<st::WriteTensor>& tensors) {
  fs::create_directories(dir);
  std::ofstream(dir / "adapter_config.json") << config.dump(2);
  st::write_file(dir / "adapter_model.safetensors", tensors);
}

nlohmann::json minimal_config(int r) {
  return {{"peft_type", "LORA"}, {"r", r}, {"lora_alpha", 8}, {"target_modules", {"q_proj"}}};
}

}  // namespace

TEST(Peft, RoundTripWritesPeftNamesAndConfig) {
  TempDir dir;
  tr::PeftAdapter a;
  a.config = {4, 16.0, 0.05, {"q_proj", "v_proj"}, true, "/models/base", false};
  a.modules.push_back(module("model.layers.0.self_attn.q_proj", 6, 8, 4, 1));
  a.modules.push_back(module("model.layers.0.self_attn.v_proj", 6, 2, 4, 3));
  a.modules.push_back(module("model.layers.1.self_attn.q_proj", 6, 8, 4, 5));
  tr::write_peft_adapter((dir / "adapter").string(), a);

  const st::File file(dir / "adapter" / "adapter_model.safetensors");
  EXPECT_EQ(file.info("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight").shape,
            (std::vector<int64_t>{4, 6}));
  EXPECT_EQ(file.info("base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight").shape,
            (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(file.tensors().size(), 6u);
  EXPECT_EQ(file.metadata().value("format", ""), "pt");
  const nlohmann::json j = longtron::read_json_file(dir / "adapter" / "adapter_config.json");
  EXPECT_EQ(j["peft_type"], "LORA");
  EXPECT_EQ(j["task_type"], "CAUSAL_LM");
  EXPECT_EQ(j["r"], 4);
  EXPECT_TRUE(j["lora_alpha"].is_number_integer());
  EXPECT_EQ(j["lora_alpha"], 16);
  EXPECT_DOUBLE_EQ(j["lora_dropout"].get<double>(), 0.05);
  EXPECT_EQ(j["target_modules"], (nlohmann::json{"q_proj", "v_proj"}));
  EXPECT_EQ(j["use_rslora"], true);
  EXPECT_EQ(j["bias"], "none");
  EXPECT_EQ(j["fan_in_fan_out"], false);
  EXPECT_EQ(j["inference_mode"], true);
  EXPECT_TRUE(j["modules_to_save"].is_null());
  EXPECT_EQ(j["base_model_name_or_path"], "/models/base");

  const tr::PeftAdapter b = tr::read_peft_adapter((dir / "adapter").string());
  EXPECT_EQ(b.config.r, 4);
  EXPECT_EQ(b.config.lora_alpha, 16.0);
  EXPECT_EQ(b.config.lora_dropout, 0.05);
  EXPECT_EQ(b.config.target_modules, a.config.target_modules);
  EXPECT_TRUE(b.config.use_rslora);
  EXPECT_EQ(b.config.base_model_name_or_path, "/models/base");
  ASSERT_EQ(b.modules.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {  // layer, then block order
    EXPECT_EQ(b.modules[i].module, a.modules[i].module);
    EXPECT_EQ(b.modules[i].in, a.modules[i].in);
    EXPECT_EQ(b.modules[i].out, a.modules[i].out);
    EXPECT_EQ(b.modules[i].A, a.modules[i].A);
    EXPECT_EQ(b.modules[i].B, a.modules[i].B);
  }
}

TEST(Peft, ReadsBf16AndF16) {
  for (const st::DType dtype : {st::DType::BF16, st::DType::F16}) {
    TempDir dir;
    const std::vector<float> A = {0.5f, -0.25f, 1.0f, 2.0f}, B = {0.125f, -3.0f};
    write_adapter_files(dir.path(), minimal_config(2),
                        {{"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", {2, 2}, dtype, A.data()},
                         {"base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", {1, 2}, dtype, B.data()}});
    const tr::PeftAdapter a = tr::read_peft_adapter(dir.path().string());
    ASSERT_EQ(a.modules.size(), 1u);
    EXPECT_EQ(a.modules[0].A, A);  // exactly representable in both
    EXPECT_EQ(a.modules[0].B, B);
    EXPECT_EQ(a.config.lora_alpha, 8.0);
  }
}

TEST(Peft, RefusalsNameTheFileAndTensor) {
  const std::string qa = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight";
  const std::string qb = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight";
  const std::vector<float> A(2 * 3, 0.1f), B(4 * 2, 0.2f), wide(3 * 3, 0.1f);
  {  // missing files
    TempDir dir;
    expect_error([&] { tr::read_peft_adapter(dir.path().string()); }, {"adapter_config.json", "missing"});
    std::ofstream(dir / "adapter_config.json") << minimal_config(2).dump();
    expect_error([&] { tr::read_peft_adapter(dir.path().string()); }, {"adapter_model.safetensors", "missing"});
  }
  {  // A without B
    TempDir dir;
    write_adapter_files(dir.path(), minimal_config(2), {{qa, {2, 3}, st::DType::F32, A.data()}});
    expect_error([&] { tr::read_peft_adapter(dir.path().string()); }, {qa, "lora_B", qb, "adapter_model.safetensors"});
  }
  {  // B without A
    TempDir dir;
    write_adapter_files(dir.path(), minimal_config(2), {{qb, {4, 2}, st::DType::F32, B.data()}});
    expect_error([&] { tr::read_peft_adapter(dir.path().string()); }, {qb, "lora_A", qa});
  }
  {  // A's rank disagrees with the config's r
    TempDir dir;
    write_adapter_files(dir.path(), minimal_config(2),
                        {{qa, {3, 3}, st::DType::F32, wide.data()}, {qb, {4, 2}, st::DType::F32, B.data()}});
    expect_error([&] { tr::read_peft_adapter(dir.path().string()); }, {qa, "[3, 3]", "r = 2", "adapter_config.json"});
  }
  {  // B [r, out] (transposed) disagrees with r
    TempDir dir;
    write_adapter_files(dir.path(), minimal_config(2),
                        {{qa, {2, 3}, st::DType::F32, A.data()}, {qb, {2, 4}, st::DType::F32, B.data()}});
    expect_error([&] { tr::read_peft_adapter(dir.path().string()); }, {qb, "[2, 4]", "r = 2"});
  }
  {  // 1-D tensor
    TempDir dir;
    write_adapter_files(dir.path(), minimal_config(2),
                        {{qa, {6}, st::DType::F32, A.data()}, {qb, {4, 2}, st::DType::F32, B.data()}});
    expect_error([&] { tr::read_peft_adapter(dir.path().string()); }, {qa, "[6]", "2-D"});
  }
  {  // NaN and Inf
    for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      TempDir dir;
      std::vector<float> b = B;
      b[5] = bad;
      write_adapter_files(dir.path(), minimal_config(2),
                          {{qa, {2, 3}, st::DType::F32, A.data()}, {qb, {4, 2}, st::DType::F32, b.data()}});
      expect_error([&] { tr::read_peft_adapter(dir.path().string()); }, {qb, "adapter_model.safetensors"});
    }
  }
  {  // another PEFT method
    TempDir dir;
    nlohmann::json c = minimal_config(2);
    c["peft_type"] = "PREFIX_TUNING";
    write_adapter_files(dir.path(), c, {{qa, {2, 3}, st::DType::F32, A.data()}, {qb, {4, 2}, st::DType::F32, B.data()}});
    expect_error([&] { tr::read_peft_adapter(dir.path().string()); }, {"adapter_config.json", "PREFIX_TUNING", "LORA"});
  }
  {  // a tensor that is not a LoRA weight
    TempDir dir;
    const std::string extra = "base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector";
    write_adapter_files(dir.path(), minimal_config(2),
                        {{qa, {2, 3}, st::DType::F32, A.data()}, {qb, {4, 2}, st::DType::F32, B.data()},
                         {extra, {2}, st::DType::F32, A.data()}});
    expect_error([&] { tr::read_peft_adapter(dir.path().string()); }, {extra, "not a LoRA weight"});
  }
  {  // r = 0 in the config
    TempDir dir;
    write_adapter_files(dir.path(), minimal_config(0), {{qa, {2, 3}, st::DType::F32, A.data()}});
    expect_error([&] { tr::read_peft_adapter(dir.path().string()); }, {"adapter_config.json", "r must be a positive"});
  }
  {  // lora_dropout outside [0, 1): refused naming the file and the value
    for (double p : {1.0, -0.25, 1.5}) {
      TempDir dir;
      nlohmann::json c = minimal_config(2);
      c["lora_dropout"] = p;
      write_adapter_files(dir.path(), c, {{qa, {2, 3}, st::DType::F32, A.data()}, {qb, {4, 2}, st::DType::F32, B.data()}});
      expect_error([&] { tr::read_peft_adapter(dir.path().string()); },
                   {"adapter_config.json", "lora_dropout", fmt::format("{}", p), "[0, 1)"});
    }
  }
  {  // per-module ranks are not represented
    TempDir dir;
    nlohmann::json c = minimal_config(2);
    c["rank_pattern"] = {{"q_proj", 4}};
    write_adapter_files(dir.path(), c, {{qa, {2, 3}, st::DType::F32, A.data()}, {qb, {4, 2}, st::DType::F32, B.data()}});
    expect_error([&] { tr::read_peft_adapter(dir.path().string()); }, {"rank_pattern"});
  }
  {  // an adapter of some layers or modules only means another model here
    for (const auto& [key, value] : std::vector<std::pair<std::string, nlohmann::json>>{
             {"layers_to_transform", {0}}, {"layers_to_transform", 0},
             {"exclude_modules", {"k_proj"}}, {"exclude_modules", ".*k_proj"},
             {"layer_replication", {{0, 1}}}}) {
      TempDir dir;
      nlohmann::json c = minimal_config(2);
      c[key] = value;
      write_adapter_files(dir.path(), c, {{qa, {2, 3}, st::DType::F32, A.data()}, {qb, {4, 2}, st::DType::F32, B.data()}});
      expect_error([&] { tr::read_peft_adapter(dir.path().string()); }, {"adapter_config.json", key});
    }
    TempDir dir;  // PEFT's defaults (null, empty) are read
    nlohmann::json c = minimal_config(2);
    c["layers_to_transform"] = nullptr;
    c["exclude_modules"] = nlohmann::json::array();
    c["layers_pattern"] = nullptr;
    write_adapter_files(dir.path(), c, {{qa, {2, 3}, st::DType::F32, A.data()}, {qb, {4, 2}, st::DType::F32, B.data()}});
    EXPECT_EQ(tr::read_peft_adapter(dir.path().string()).modules.size(), 1u);
  }
  {  // writing a non-finite value
    TempDir dir;
    tr::PeftAdapter a;
    a.config.r = 2;
    a.config.target_modules = {"q_proj"};
    a.modules.push_back({"model.layers.0.self_attn.q_proj", 3, 4, A, B});
    a.modules[0].A[4] = std::numeric_limits<float>::quiet_NaN();
    expect_error([&] { tr::write_peft_adapter((dir / "out").string(), a); }, {qa, "non-finite", "element 4"});
    EXPECT_FALSE(fs::exists(dir / "out" / "adapter_model.safetensors"));
    a.config.r = 0;
    expect_error([&] { tr::write_peft_adapter((dir / "out").string(), a); }, {"r = 0"});
  }
}

TEST(Peft, FingerprintIsStableAndSeesEveryByte) {
  TempDir dir;
  std::vector<float> w = random_values(100000, 9);
  st::write_file(dir / "model.safetensors", {{"x", {100000}, st::DType::F32, w.data()}});
  std::ofstream(dir / "config.json") << "{}";
  const std::string f1 = tr::base_fingerprint(dir.path().string());
  EXPECT_EQ(f1, tr::base_fingerprint(dir.path().string()));
  EXPECT_EQ(f1.rfind("lt64:", 0), 0u);
  std::ofstream(dir / "config.json") << "{\"changed\": 1}";  // not weights
  EXPECT_EQ(f1, tr::base_fingerprint(dir.path().string()));
  w[77777] = std::nextafter(w[77777], 2.0f);  // one bit of one value
  st::write_file(dir / "model.safetensors", {{"x", {100000}, st::DType::F32, w.data()}});
  EXPECT_NE(f1, tr::base_fingerprint(dir.path().string()));
  TempDir empty;
  expect_error([&] { tr::base_fingerprint(empty.path().string()); }, {empty.path().string(), "no weights"});
}

// The module names the files use are the ones training adapts (model::lora_modules).
TEST(Peft, FamilyModuleNames) {
  const model::ParamTable llama(tiny_config("llama")), intern(tiny_config("internlm2"));
  const auto l = all_linears(llama);
  ASSERT_EQ(l.size(), 14u);
  EXPECT_EQ(l[0].module, "model.layers.0.self_attn.q_proj");
  EXPECT_EQ(l[0].out, 8);
  EXPECT_EQ(l[1].module, "model.layers.0.self_attn.k_proj");
  EXPECT_EQ(l[1].out, 4);
  EXPECT_EQ(l[3].module, "model.layers.0.self_attn.o_proj");
  EXPECT_EQ(l[4].module, "model.layers.0.mlp.gate_proj");
  EXPECT_EQ(l[5].module, "model.layers.0.mlp.up_proj");
  EXPECT_EQ(l[6].module, "model.layers.0.mlp.down_proj");
  EXPECT_EQ(l[6].in, l[4].out);
  EXPECT_EQ(l[7].module, "model.layers.1.self_attn.q_proj");
  const auto i = all_linears(intern, {"wqkv", "w2"});
  ASSERT_EQ(i.size(), 4u);
  EXPECT_EQ(i[0].module, "model.layers.0.attention.wqkv");
  EXPECT_EQ(i[0].out, 16);
  EXPECT_EQ(i[1].module, "model.layers.0.feed_forward.w2");
  EXPECT_EQ(all_linears(intern)[1].module, "model.layers.0.attention.wo");
}

TEST(Peft, MergeAddsScaledProduct) {
  const model::ParamTable layout(tiny_config("llama"));
  model::Params<float> w(layout);
  model::init_params(w, 3);
  tr::PeftAdapter a = full_adapter(layout, 3, 11);
  for (const bool rslora : {false, true}) {
    a.config.use_rslora = rslora;
    const double s = rslora ? 16 / std::sqrt(3.0) : 16 / 3.0;
    EXPECT_DOUBLE_EQ(tr::lora_scale(a.config), s);
    model::Params<float> merged(layout);
    std::copy(w.data(), w.data() + w.numel(), merged.data());
    tr::merge_peft_adapter(a, merged, "test");
    for (const auto& l : all_linears(layout)) {
      const auto& m = *std::find_if(a.modules.begin(), a.modules.end(), [&](auto& x) { return x.module == l.module; });
      std::vector<float> before(size_t(m.out * m.in)), after(before.size());
      const model::HfTensor t{l.module + ".weight", {l.out, l.in}, l.base_view, l.rows};
      model::gather_hf(t, layout, w.data(), before.data());
      model::gather_hf(t, layout, merged.data(), after.data());
      for (int64_t o = 0; o < m.out; ++o)
        for (int64_t i = 0; i < m.in; ++i) {
          double d = 0;
          for (int k = 0; k < 3; ++k) d += double(m.B[size_t(o * 3 + k)]) * m.A[size_t(k * m.in + i)];
          EXPECT_NEAR(after[size_t(o * m.in + i)], before[size_t(o * m.in + i)] + s * d, 1e-6) << l.module;
        }
    }
  }
}

TEST(Peft, AdapterMustFitTheModel) {
  const model::ParamTable layout(tiny_config("llama"));
  const tr::PeftAdapter good = full_adapter(layout, 2, 5);
  tr::check_adapter_fits(good, layout, "here");
  {  // shape of the base disagrees
    tr::PeftAdapter a = good;
    a.modules[1].out = 6;
    a.modules[1].B.resize(12);
    expect_error([&] { tr::check_adapter_fits(a, layout, "here"); },
                 {"here", "model.layers.0.self_attn.k_proj", "[4, 8]"});
  }
  {  // an unknown module
    tr::PeftAdapter a = good;
    a.modules[0].module = "model.layers.0.self_attn.qkv_proj";
    expect_error([&] { tr::check_adapter_fits(a, layout, "here"); },
                 {"base_model.model.model.layers.0.self_attn.qkv_proj.lora_A.weight", "qkv_proj"});
    a.modules[0].module = "model.layers.7.self_attn.q_proj";
    expect_error([&] { tr::check_adapter_fits(a, layout, "here"); }, {"model.layers.7.self_attn.q_proj", "layer 7"});
  }
  {  // an InternLM2 adapter on a Llama model
    const model::ParamTable intern(tiny_config("internlm2"));
    expect_error([&] { tr::check_adapter_fits(full_adapter(intern, 2, 5), layout, "here"); },
                 {"wqkv", "--format llama"});
  }
  {  // module outside target_modules, unknown target name, rank 0, NaN
    tr::PeftAdapter a = good;
    a.config.target_modules = {"q_proj"};
    expect_error([&] { tr::check_adapter_fits(a, layout, "here"); }, {"k_proj", "target_modules"});
    a = good;
    a.config.target_modules.push_back("c_attn");
    expect_error([&] { tr::check_adapter_fits(a, layout, "here"); }, {"c_attn"});
    a = good;
    a.config.r = 0;
    expect_error([&] { tr::check_adapter_fits(a, layout, "here"); }, {"r = 0"});
    a = good;
    a.modules[3].B[1] = std::numeric_limits<float>::infinity();
    expect_error([&] { tr::check_adapter_fits(a, layout, "here"); },
                 {"base_model.model.model.layers.0.self_attn.o_proj.lora_B.weight", "non-finite"});
  }
}

// InternLM2's wqkv adapter as Llama's q/k/v adapters: the merged models are bitwise the same
// (q, k and v take their rows of B; A is shared), and the way back is exact too.
TEST(Peft, InternLm2WqkvAdapterAsLlamaIsExact) {
  const model::ModelConfig ci = tiny_config("internlm2"), cl = tiny_config("llama");
  const model::ParamTable intern(ci), llama(cl);
  const tr::PeftAdapter a = full_adapter(intern, 3, 21);
  const tr::PeftAdapter b = tr::internlm2_adapter_as_llama(a, ci);
  EXPECT_EQ(b.config.target_modules, model::lora_family_targets("llama"));
  ASSERT_EQ(b.modules.size(), 14u);
  EXPECT_EQ(b.modules[0].module, "model.layers.0.self_attn.q_proj");
  EXPECT_EQ(b.modules[0].A, a.modules[0].A);
  EXPECT_EQ(b.modules[2].A, a.modules[0].A);
  // Group 1's first query row is wqkv row (Hq/Hkv + 2)·d = 8; q_proj's row 4 (head 2).
  EXPECT_EQ(std::vector<float>(b.modules[0].B.begin() + 4 * 3, b.modules[0].B.begin() + 5 * 3),
            std::vector<float>(a.modules[0].B.begin() + 8 * 3, a.modules[0].B.begin() + 9 * 3));
  model::Params<float> wi(intern), wl(llama);
  model::init_params(wi, 1);
  std::copy(wi.data(), wi.data() + wi.numel(), wl.data());  // one engine layout for both
  tr::merge_peft_adapter(a, wi, "internlm2");
  tr::merge_peft_adapter(b, wl, "llama");
  EXPECT_EQ(std::vector<float>(wi.data(), wi.data() + wi.numel()),
            std::vector<float>(wl.data(), wl.data() + wl.numel()));
  const tr::PeftAdapter back = tr::llama_adapter_as_internlm2(b, cl);
  ASSERT_EQ(back.modules.size(), a.modules.size());
  for (size_t i = 0; i < a.modules.size(); ++i) {
    EXPECT_EQ(back.modules[i].module, a.modules[i].module);
    EXPECT_EQ(back.modules[i].A, a.modules[i].A);
    EXPECT_EQ(back.modules[i].B, a.modules[i].B);
  }
  EXPECT_EQ(back.config.target_modules, model::lora_family_targets("internlm2"));
}

// Llama adapters whose q, k and v have their own A fuse only at rank 3r (still exact up to the
// rounding of B's rescaling), and are refused at rank r.
TEST(Peft, LlamaSeparateAFusesAtThreeTimesTheRank) {
  const model::ModelConfig ci = tiny_config("internlm2"), cl = tiny_config("llama");
  const model::ParamTable intern(ci), llama(cl);
  const tr::PeftAdapter a = full_adapter(llama, 2, 31);
  expect_error([&] { tr::llama_adapter_as_internlm2(a, cl); }, {"different lora_A", "rank 6"});
  const tr::PeftAdapter f = tr::llama_adapter_as_internlm2(a, cl, true);
  EXPECT_EQ(f.config.r, 6);
  model::Params<float> wi(intern), wl(llama);
  model::init_params(wi, 2);
  std::copy(wi.data(), wi.data() + wi.numel(), wl.data());
  tr::merge_peft_adapter(f, wi, "fused");
  tr::merge_peft_adapter(a, wl, "separate");
  for (int64_t i = 0; i < wi.numel(); ++i) EXPECT_NEAR(wi.data()[i], wl.data()[i], 1e-6) << i;
}
