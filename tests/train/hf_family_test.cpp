// Hugging Face families (docs/model.md): a tiny Llama checkpoint's loss and first-step gradients
// against an independent float64 reference of Hugging Face's Llama semantics, config.json
// detection and pass-through, name tables, round trips and bad input.
//
// What was checked against Hugging Face's published code (transformers, read with code search):
// modeling_qwen3.py — Qwen3Attention: q_norm / k_norm (Qwen3RMSNorm over head_dim) of each head of
// q_proj / k_proj's output, before RoPE; q/k/v/o_proj bias=attention_bias. configuration_qwen3.py —
// head_dim (default 128), num_key_value_heads (default 32), use_sliding_window, max_window_layers.
// modeling_llama.py — LlamaForCausalLM state-dict names model.embed_tokens, model.layers.{i}.
// self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj, input_layernorm, post_attention_layernorm,
// model.norm, lm_head; q_proj [Hq·d, H], k/v_proj [Hkv·d, H], o_proj [H, Hq·d], gate/up [F, H],
// down [H, F]; repeat_kv (query head j reads kv head j // (Hq/Hkv)); rotate_half RoPE with
// inv_freq = 1 / theta^(2i/d); RMSNorm w · x / sqrt(mean(x²) + eps); MLP down(silu(gate) · up).
// configuration_llama.py — keys vocab_size, hidden_size, intermediate_size, num_hidden_layers,
// num_attention_heads, num_key_value_heads (None → num_attention_heads), hidden_act, rms_norm_eps,
// rope_theta, rope_scaling, attention_bias, mlp_bias (llama_mlp_bias), head_dim, tie_word_embeddings. Qwen2:
// q/k/v_proj bias=True, o_proj bias=False. Mistral: sliding_window default 4096.
// The reference lives in tests/tools/make_llama_golden.py; its output is committed in
// tests/fixtures/llama_golden (the suite needs no PyTorch).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <memory>

#include "core/safetensors.h"
#include "expect_error.h"
#include "model/decoder.h"
#include "model/hf_config.h"
#include "model/hf_names.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/model_io.h"

namespace longtron {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using testing::expect_error;
using testing::TempDir;

const fs::path kFixture = fs::path(LONGTRON_SOURCE_DIR) / "tests/fixtures/llama_golden";

json read_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

std::vector<int32_t> ints(const safetensors::Reader& r, const std::string& name) {
  std::vector<int32_t> out;
  for (int64_t v : r.file_of(name).read_ints(name)) out.push_back(static_cast<int32_t>(v));
  return out;
}

data::MicroBatch golden_row(const safetensors::Reader& golden) {
  data::MicroBatch b;
  b.input_ids = ints(golden, "input_ids");
  b.labels = ints(golden, "labels");
  b.indexes = ints(golden, "indexes");
  b.cu_seqlens = ints(golden, "cu_seqlens");
  for (size_t s = 0; s + 1 < b.cu_seqlens.size(); ++s)
    b.max_seqlen = std::max(b.max_seqlen, b.cu_seqlens[s + 1] - b.cu_seqlens[s]);
  return b;
}

/// The weights of fixture `base` under `variant`'s config.json (a copy in `dir`), or the variant
/// itself when it has weights.
fs::path with_config(const TempDir& dir, const std::string& variant, const std::string& base) {
  const fs::path src = kFixture.parent_path() / variant;
  if (fs::exists(src / "model.safetensors")) return src;
  const fs::path out = dir / variant;
  fs::create_directories(out);
  fs::copy_file(src / "config.json", out / "config.json");
  fs::copy_file(kFixture.parent_path() / base / "model.safetensors", out / "model.safetensors");
  return out;
}

/// The loaded weights as a one-process model (the CLI goes through the engine; these checks
/// compare the model's own numbers).
std::unique_ptr<model::Decoder<float>> model_of(const train::LoadedModel& m) {
  return std::make_unique<model::Decoder<float>>(*m.layout, *m.params);
}

/// Loss (1e-5) and every gradient (max |g − ref| ≤ 1e-4 · max |ref| per tensor, by Hugging Face
/// name) of `variant` against its float64 reference; chunk > 0: through the chunked
/// recomputation (model.checkpoint) in chunks of that many tokens.
void expect_golden(const std::string& variant, const std::string& type = "llama",
                   const std::string& base = "llama_golden", int64_t chunk = 0) {
  TempDir dir;
  const train::LoadedModel m = train::load_model_dir(with_config(dir, variant, base));
  ASSERT_EQ(m.layout->config().type, type);
  model::ModelConfig recomputed = m.layout->config();
  recomputed.checkpoint = chunk > 0;
  recomputed.chunk_tokens = chunk > 0 ? chunk : recomputed.chunk_tokens;
  const model::ParamTable layout(recomputed);
  model::Decoder<float> decoder(layout, *m.params);
  ASSERT_EQ(decoder.chunked(), chunk > 0);
  const safetensors::Reader golden(kFixture.parent_path() / variant / "golden.safetensors");
  const data::MicroBatch b = golden_row(golden);
  int64_t count = 0;
  for (int32_t l : b.labels) count += l != data::kIgnoreIndex;
  model::Params<float> grads(*m.layout);
  const model::LossSum ls = decoder.forward_backward(b, grads, 1.0 / double(count));
  const double ref_loss = golden.file_of("loss").read_doubles("loss").at(0);
  EXPECT_NEAR(ls.sum / double(ls.count), ref_loss, 1e-5 * std::abs(ref_loss)) << variant;
  double worst = 0;  // max over tensors of max |g − ref| / max |ref|
  const train::HfTensors named = train::hf_named_tensors(grads);
  size_t expected_tensors = 0;
  for (const auto& name : golden.names()) expected_tensors += name.rfind("grad.", 0) == 0;
  ASSERT_EQ(named.tensors.size(), expected_tensors);
  for (size_t k = 0; k < named.tensors.size(); ++k) {
    const auto& t = named.tensors[k];
    const auto ref = golden.file_of("grad." + t.name).read_floats("grad." + t.name);
    ASSERT_EQ(ref.size(), static_cast<size_t>(t.numel())) << t.name;
    double err = 0, scale = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      err = std::max(err, std::abs(double(t.data[i]) - double(ref[i])));
      scale = std::max(scale, std::abs(double(ref[i])));
    }
    EXPECT_GT(scale, 0.0) << t.name;
    EXPECT_LE(err, 1e-4 * scale) << variant << " " << t.name << ": max error " << err
                                 << ", max |grad| " << scale;
    if (scale > 0) worst = std::max(worst, err / scale);
  }
  std::printf("[golden] %s: loss rel err %.2e, worst gradient err / max|ref| %.2e\n", variant.c_str(),
              std::abs(ls.sum / double(ls.count) - ref_loss) / std::abs(ref_loss), worst);
}

TEST(HfFamily, LlamaGoldenLossAndGradients) { expect_golden("llama_golden"); }
TEST(HfFamily, LlamaRopeLinearGolden) { expect_golden("llama_rope_linear"); }
TEST(HfFamily, LlamaRopeLlama3Golden) { expect_golden("llama_rope_llama3"); }
TEST(HfFamily, LlamaHeadDimGolden) { expect_golden("llama_head_dim"); }
TEST(HfFamily, LlamaAttentionBiasGolden) { expect_golden("llama_attention_bias"); }
TEST(HfFamily, LlamaMlpBiasGolden) { expect_golden("llama_mlp_bias"); }
TEST(HfFamily, Qwen2Golden) { expect_golden("qwen2_golden", "qwen2"); }
TEST(HfFamily, MistralGolden) { expect_golden("mistral_golden", "mistral"); }
// tie_word_embeddings: one tensor serves as embedding and head; its gradient is the sum of both.
TEST(HfFamily, Qwen2TiedGolden) { expect_golden("qwen2_tied", "qwen2"); }
// Qwen3: q_norm / k_norm (per-head RMSNorm before RoPE) with head_dim 8 over hidden 24; untied
// without biases, and tied with attention_bias; also through the chunked recomputation, chunks of
// 5 tokens (boundaries inside documents).
TEST(HfFamily, Qwen3Golden) { expect_golden("qwen3_golden", "qwen3"); }
TEST(HfFamily, Qwen3TiedGolden) { expect_golden("qwen3_tied", "qwen3"); }
TEST(HfFamily, Qwen3GoldenThroughChunks) {
  expect_golden("qwen3_golden", "qwen3", "llama_golden", 5);
  expect_golden("qwen3_tied", "qwen3", "llama_golden", 5);
}

// Qwen3's config.json: head_dim, attention_bias on q, k, v and o, the sliding fields ignored while
// use_sliding_window is false (and written back as read), q/k norm tensors under Qwen3's names.
TEST(HfFamily, Qwen3ConfigAndNames) {
  const fs::path dir = kFixture.parent_path() / "qwen3_tied";
  const model::ModelConfig c = model::read_hf_config(dir);
  EXPECT_EQ(c.type, "qwen3");
  EXPECT_EQ(c.head_dim(), 8);
  EXPECT_EQ(c.explicit_head_dim, 8);
  EXPECT_TRUE(c.qkv_bias && c.o_bias && !c.mlp_bias);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.sliding_window, 0) << "use_sliding_window is false";
  EXPECT_EQ(model::to_hf_config(c), read_json(dir / "config.json"));
  const model::ParamTable layout(c);
  EXPECT_EQ(layout.view(layout.layers[1].q_norm).shape, std::vector<int64_t>{8});
  std::vector<std::string> names;
  for (const auto& t : model::hf_tensors(layout)) names.push_back(t.name);
  for (const char* n :
       {"model.layers.1.self_attn.q_norm.weight", "model.layers.1.self_attn.k_norm.weight",
        "model.layers.0.self_attn.o_proj.bias"})
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
  // Absent keys take Qwen3Config's defaults: head_dim 128, 32 kv heads.
  json bare = read_json(dir / "config.json");
  bare.erase("head_dim");
  bare.erase("num_key_value_heads");
  bare["num_attention_heads"] = 32;
  const model::ModelConfig d = model::from_hf_config(bare, "bare");
  EXPECT_EQ(d.head_dim(), 128);
  EXPECT_EQ(d.num_kv_attention_heads, 32);
  bare["num_attention_heads"] = 4;  // the default 32 kv heads cannot divide 4 heads: say so
  testing::expect_error([&] { model::from_hf_config(bare, "bare"); },
                        {"num_key_value_heads", "got 32 (the key is absent: Qwen3's default)"});
  // With use_sliding_window: the window from max_window_layers on, as Qwen2.
  json sliding = read_json(dir / "config.json");
  sliding["use_sliding_window"] = true;
  const model::ModelConfig w = model::from_hf_config(sliding, "sliding");
  EXPECT_EQ(w.window_of(0), 0);
  EXPECT_EQ(w.window_of(1), 4);
  // layer_types, when given, names the sliding layers itself (max_window_layers then does not),
  // is written back from the model's layers, and is checked even while the window is off.
  json typed = sliding;
  typed["max_window_layers"] = 0;
  typed["layer_types"] = {"sliding_attention", "full_attention"};
  const model::ModelConfig t = model::from_hf_config(typed, "typed");
  EXPECT_EQ(t.window_of(0), 4);
  EXPECT_EQ(t.window_of(1), 0);
  EXPECT_EQ(model::to_hf_config(t)["layer_types"], typed["layer_types"]);
  typed["use_sliding_window"] = false;
  EXPECT_EQ(model::from_hf_config(typed, "off").windowed_layers(), 0);
  typed["layer_types"] = {"full_attention"};
  testing::expect_error([&] { model::from_hf_config(typed, "short"); },
                        {"short: layer_types has 1 entries, num_hidden_layers is 2"});
  typed["layer_types"] = {"full_attention", "chunked_attention"};
  testing::expect_error([&] { model::from_hf_config(typed, "odd"); }, {"layer_types[1]"});
}

// The keys of Qwen3-0.6B's published config.json (rope_scaling and sliding_window null, the
// window off): its shape, and the same JSON written back.
TEST(HfFamily, Qwen3PublishedConfigShape) {
  const json hub = json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
    "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
    "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
    "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})");
  const model::ModelConfig c = model::from_hf_config(hub, "Qwen3-0.6B");
  EXPECT_EQ(c.head_dim(), 128);
  EXPECT_EQ(c.attention_size(), 2048);
  EXPECT_EQ(c.num_kv_attention_heads, 8);
  EXPECT_EQ(c.ffn_size(), 3072);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.qkv_bias || c.o_bias || c.mlp_bias);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_EQ(model::ParamTable(c).numel(), 596049920);  // Qwen3-0.6B's 0.6B (0.44B non-embedding)
  EXPECT_EQ(model::to_hf_config(c), hub);
}

// Transformers 5 writes RoPE as rope_parameters (rope_type, rope_theta and the scaling's keys in
// one object) instead of rope_theta and rope_scaling: read the same, written back with both.
TEST(HfFamily, RopeParametersOfTransformers5) {
  json hf = read_json(kFixture.parent_path() / "qwen3_golden" / "config.json");
  hf.erase("rope_theta");
  hf["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1000000.0}};
  model::ModelConfig c = model::from_hf_config(hf, "v5");
  EXPECT_DOUBLE_EQ(c.rope_base, 1e6);
  EXPECT_EQ(c.rope_scaling_type, "");
  const json back = model::to_hf_config(c);
  EXPECT_EQ(back["rope_parameters"], hf["rope_parameters"]);
  EXPECT_EQ(back["rope_theta"], 1e6);
  EXPECT_DOUBLE_EQ(model::from_hf_config(back, "back").rope_base, 1e6);
  // Absent: the family's default; llama3 scaling inside rope_parameters.
  hf["rope_parameters"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                           {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 16}};
  c = model::from_hf_config(hf, "v5");
  EXPECT_DOUBLE_EQ(c.rope_base, 10000.0);
  EXPECT_EQ(c.rope_scaling_type, "llama3");
  EXPECT_DOUBLE_EQ(c.rope_factor, 8.0);
  // Both keys disagreeing, and one RoPE per layer type, are refused.
  hf["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 500.0}};
  hf["rope_theta"] = 600.0;
  expect_error([&] { model::from_hf_config(hf, "v5"); },
               {"v5", "rope_theta = 600", "rope_parameters.rope_theta = 500"});
  hf.erase("rope_theta");
  hf["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}, {"rope_theta", 1e6}}},
                           {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 1e4}}}};
  expect_error([&] { model::from_hf_config(hf, "v5"); },
               {"v5", "rope_parameters.full_attention", "per layer type"});
}

// A family without q/k norms cannot hold Qwen3's, nor Qwen3's names a model without them.
TEST(HfFamily, Qwen3NormsAreRefusedWhereTheFormatHasNone) {
  const model::ModelConfig q = model::read_hf_config(kFixture.parent_path() / "qwen3_golden");
  expect_error([&] { model::to_hf_config(q, 0, "llama"); }, {"llama", "q_norm and k_norm"});
  expect_error([&] { model::hf_tensors(model::ParamTable(q), "llama"); }, {"q_norm and k_norm"});
  const model::ModelConfig l = model::read_hf_config(kFixture);
  expect_error([&] { model::to_hf_config(l, 0, "qwen3"); }, {"qwen3", "q_norm and k_norm", "none"});
}

// Tied: the layout has no output tensor (the head reads the embedding), the files no lm_head, the
// head still counts in matmul_numel, and config.json says so on the way back.
TEST(HfFamily, TiedLayoutHasOneTensor) {
  const train::LoadedModel tied = train::load_model_dir(kFixture.parent_path() / "qwen2_tied");
  const train::LoadedModel plain = train::load_model_dir(kFixture.parent_path() / "qwen2_golden");
  const model::ParamTable& t = *tied.layout;
  ASSERT_TRUE(t.config().tie_word_embeddings);
  EXPECT_EQ(t.output, t.tok_embeddings);
  EXPECT_EQ(t.find("output.weight"), -1);
  const int64_t VH = t.config().vocab_size * t.config().hidden_size;
  EXPECT_EQ(t.numel(), plain.layout->numel() - VH);
  EXPECT_EQ(t.matmul_numel(), plain.layout->matmul_numel());
  for (const auto& x : train::hf_named_tensors(*tied.params).tensors) EXPECT_NE(x.name, "lm_head.weight");
  EXPECT_EQ(model::to_hf_config(t.config(), 0)["tie_word_embeddings"], true);
  EXPECT_EQ(model::to_hf_config(plain.layout->config(), 0)["tie_word_embeddings"], false);
}
// Windows shorter than the documents (Hugging Face's rule: key j visible to query i when
// i − W < j ≤ i): Mistral W = 4 in every layer; Qwen2 W = 3 from max_window_layers = 1 on.
TEST(HfFamily, MistralWindowGolden) { expect_golden("mistral_window", "mistral", "mistral_golden"); }
TEST(HfFamily, Qwen2WindowGolden) { expect_golden("qwen2_window", "qwen2", "qwen2_golden"); }

// A window no document reaches changes nothing: exactly the loss and gradients without one.
TEST(HfFamily, WindowLongerThanEveryDocumentIsExact) {
  TempDir dir;
  const fs::path base = kFixture.parent_path() / "mistral_golden";
  const safetensors::Reader golden(base / "golden.safetensors");
  const data::MicroBatch b = golden_row(golden);
  json cfg = read_json(base / "config.json");
  const train::LoadedModel plain = train::load_model_dir(base);
  cfg["sliding_window"] = 9;  // the longest document has 9 tokens
  fs::create_directories(dir / "w9");
  std::ofstream(dir / "w9" / "config.json") << cfg.dump(2);
  fs::copy_file(base / "model.safetensors", dir / "w9" / "model.safetensors");
  const train::LoadedModel windowed = train::load_model_dir(dir / "w9");
  ASSERT_EQ(windowed.layout->config().sliding_window, 9);
  model::Params<float> g1(*plain.layout), g2(*windowed.layout);
  EXPECT_EQ(model_of(plain)->forward_backward(b, g1, 0.1).sum, model_of(windowed)->forward_backward(b, g2, 0.1).sum);
  for (int64_t i = 0; i < g1.numel(); ++i) ASSERT_EQ(g1.data()[i], g2.data()[i]) << i;
}

// Dynamic (InternLM2.5): plain RoPE below max_position_embeddings — the loss of the unscaled model
// exactly — and an error naming the position at or beyond it.
TEST(HfFamily, RopeDynamicIsPlainBelowTheLimitAndRefusedBeyond) {
  TempDir dir;
  const safetensors::Reader golden(kFixture / "golden.safetensors");
  const data::MicroBatch b = golden_row(golden);
  const train::LoadedModel plain = train::load_model_dir(kFixture);
  const double expected = model_of(plain)->forward_loss(b).sum;
  json cfg = read_json(kFixture / "config.json");
  cfg["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
  for (const int limit : {64, 8}) {
    const fs::path out = dir / ("dynamic" + std::to_string(limit));
    fs::create_directories(out);
    cfg["max_position_embeddings"] = limit;
    std::ofstream(out / "config.json") << cfg.dump(2);
    fs::copy_file(kFixture / "model.safetensors", out / "model.safetensors");
    const train::LoadedModel m = train::load_model_dir(out);
    EXPECT_EQ(m.layout->config().rope_scaling_type, "dynamic");
    if (limit == 64) {
      EXPECT_EQ(model_of(m)->forward_loss(b).sum, expected);
    } else {  // the 9-token document reaches position 8
      expect_error([&] { model_of(m)->forward_loss(b); }, {"position 8", "max_position_embeddings = 8"});
    }
  }
  cfg.erase("max_position_embeddings");
  expect_error([&] { model::from_hf_config(cfg, "c.json"); }, {"dynamic", "max_position_embeddings"});
  cfg["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  expect_error([&] { model::from_hf_config(cfg, "c.json"); }, {"rope_scaling.low_freq_factor"});
}

// Every family's folder written back as its own family: the same names, values and config.json.
TEST(HfFamily, EachFamilyRoundTripsItsNamesAndConfig) {
  TempDir dir;
  for (const std::string variant :
       {"llama_golden", "llama_head_dim", "llama_attention_bias", "qwen2_golden", "mistral_golden",
        "qwen2_tied", "llama_mlp_bias", "qwen3_golden", "qwen3_tied"}) {
    const fs::path src = kFixture.parent_path() / variant;
    const train::LoadedModel a = train::load_model_dir(src);
    const fs::path out = dir / variant;
    fs::create_directories(out);
    model::write_hf_config(out / "config.json", a.layout->config());
    const train::HfTensors named = train::hf_named_tensors(*a.params);
    std::vector<safetensors::WriteTensor> w;
    for (const auto& t : named.tensors) w.push_back({t.name, t.shape, safetensors::DType::F32, t.data, nullptr});
    safetensors::write_file(out / "model.safetensors", w);
    EXPECT_EQ(read_json(out / "config.json"), read_json(src / "config.json")) << variant;
    const safetensors::Reader in(src), back(out);
    auto names = in.names(), names_back = back.names();
    std::sort(names.begin(), names.end());
    std::sort(names_back.begin(), names_back.end());
    ASSERT_EQ(names, names_back) << variant;
    for (const auto& n : names)
      EXPECT_EQ(in.file_of(n).read_floats(n), back.file_of(n).read_floats(n)) << variant << " " << n;
  }
}

TEST(HfFamily, DetectsTypeAndPassesUnusedKeysThrough) {
  const model::ModelConfig c = model::read_hf_config(kFixture);
  EXPECT_EQ(c.type, "llama");
  EXPECT_EQ(c.hidden_size, 24);
  EXPECT_EQ(c.ffn_size(), 40);
  EXPECT_EQ(c.num_kv_attention_heads, 2);
  EXPECT_DOUBLE_EQ(c.rope_base, 5000.0);
  // Written back: the same keys with the same values, max_position_embeddings untouched.
  const json in = read_json(kFixture / "config.json");
  EXPECT_EQ(model::to_hf_config(c, 4096), in);
}

TEST(HfFamily, LlamaNamesSplitGroupedWqkv) {
  model::ModelConfig c = model::read_hf_config(kFixture);
  const model::ParamTable layout(c);
  const auto list = model::hf_tensors(layout);
  std::map<std::string, model::HfTensor> by_name;
  for (const auto& t : list) by_name[t.name] = t;
  const auto& q = by_name.at("model.layers.1.self_attn.q_proj.weight");
  const auto& k = by_name.at("model.layers.1.self_attn.k_proj.weight");
  const auto& v = by_name.at("model.layers.1.self_attn.v_proj.weight");
  EXPECT_EQ(q.shape, (std::vector<int64_t>{24, 24}));
  EXPECT_EQ(k.shape, (std::vector<int64_t>{12, 24}));
  // wqkv rows [Hkv=2, Hq/Hkv + 2 = 4, d = 6]: group g holds q(2 heads), k_g, v_g.
  using Rows = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(q.rows, (Rows{{0, 12}, {24, 12}}));
  EXPECT_EQ(k.rows, (Rows{{12, 6}, {36, 6}}));
  EXPECT_EQ(v.rows, (Rows{{18, 6}, {42, 6}}));
  // Every element of the engine's buffer is covered exactly once.
  model::Params<float> p(layout);
  std::vector<float> ones;
  for (const auto& t : list) {
    int64_t n = 1;
    for (auto s : t.shape) n *= s;
    ones.assign(size_t(n), 0.f);
    model::gather_hf(t, layout, p.data(), ones.data());
    for (auto& x : ones) x += 1.f;
    model::scatter_hf(t, layout, ones.data(), p.data());
  }
  for (int64_t i = 0; i < p.numel(); ++i) ASSERT_EQ(p.data()[i], 1.f) << i;
  // A tensor of one run lies in the buffer as gather_hf copies it; q/k/v do not.
  for (int64_t i = 0; i < p.numel(); ++i) p.data()[i] = static_cast<float>(i);
  for (const auto& t : list) {
    const float* in_place = model::hf_in_place(t, layout, p.data());
    EXPECT_EQ(in_place == nullptr, t.rows.size() > 1) << t.name;
    if (in_place == nullptr) continue;
    int64_t n = 1;
    for (auto s : t.shape) n *= s;
    ones.assign(size_t(n), 0.f);
    model::gather_hf(t, layout, p.data(), ones.data());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(in_place[i], ones[size_t(i)]) << t.name << " " << i;
  }
  EXPECT_EQ(model::hf_in_place(q, layout, p.data()), nullptr);
}

TEST(HfFamily, RoundTripIsBitIdentical) {
  TempDir dir;
  const train::LoadedModel a = train::load_model_dir(kFixture);
  // Written as llama (the fixture's family) and as internlm2, then read back.
  for (const std::string format : {"llama", "internlm2"}) {
    const fs::path out = dir / format;
    fs::create_directories(out);
    model::write_hf_config(out / "config.json", a.layout->config(), 0, format);
    const train::HfTensors named = train::hf_named_tensors(*a.params, "", format);
    std::vector<safetensors::WriteTensor> w;
    for (const auto& t : named.tensors) w.push_back({t.name, t.shape, safetensors::DType::F32, t.data, nullptr});
    safetensors::write_file(out / "model.safetensors", w);
    const train::LoadedModel b = train::load_model_dir(out);
    EXPECT_EQ(b.layout->config().type, format);
    ASSERT_EQ(b.params->numel(), a.params->numel());
    for (int64_t i = 0; i < a.params->numel(); ++i)
      ASSERT_EQ(a.params->data()[i], b.params->data()[i]) << format << " element " << i;
  }
  // The llama folder's names and config.json are the input's.
  const safetensors::Reader in(kFixture / "model.safetensors"), out(dir / "llama");
  auto names = [](const safetensors::Reader& r) {
    auto n = r.names();
    std::sort(n.begin(), n.end());
    return n;
  };
  EXPECT_EQ(names(in), names(out));
  EXPECT_EQ(read_json(dir / "llama" / "config.json"), read_json(kFixture / "config.json"));
  // InternLM2 written from a llama source drops nothing it needs and adds its bias keys.
  const json j = read_json(dir / "internlm2" / "config.json");
  EXPECT_EQ(j["architectures"][0], "InternLM2ForCausalLM");
  EXPECT_EQ(j["bos_token_id"], 1);
}

// Llama's mlp_bias (LlamaMLP: nn.Linear(..., bias=config.mlp_bias) on gate/up/down_proj): read,
// named, written back; a family whose config.json has no mlp_bias refuses to write it.
TEST(HfFamily, LlamaMlpBiasNamesAndConfig) {
  json cfg = read_json(kFixture / "config.json");
  cfg["mlp_bias"] = true;
  const model::ModelConfig c = model::from_hf_config(cfg, "c.json");
  EXPECT_TRUE(c.mlp_bias);
  const model::ParamTable layout(c);
  const model::ModelConfig plain_config = model::read_hf_config(kFixture);
  const model::ParamTable plain(plain_config);
  const int64_t F = c.ffn_size(), H = c.hidden_size;
  EXPECT_EQ(layout.numel() - plain.numel(), c.num_layers * (2 * F + H));
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& t : model::hf_tensors(layout)) shapes[t.name] = t.shape;
  for (int i = 0; i < 2; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".mlp.";
    EXPECT_EQ(shapes[p + "gate_proj.bias"], std::vector<int64_t>{F});
    EXPECT_EQ(shapes[p + "up_proj.bias"], std::vector<int64_t>{F});
    EXPECT_EQ(shapes[p + "down_proj.bias"], std::vector<int64_t>{H});
  }
  EXPECT_EQ(shapes.size(), model::hf_tensors(plain).size() + 6);
  EXPECT_EQ(model::to_hf_config(c, 0), cfg);
  for (const char* format : {"qwen2", "mistral", "internlm2"})
    expect_error([&] { model::to_hf_config(c, 0, format); }, {format, "mlp_bias"});
}

TEST(HfFamily, BadConfigsNameTheKey) {
  const json base = read_json(kFixture / "config.json");
  auto with = [&](const char* key, const json& value) {
    json j = base;
    j[key] = value;
    return j;
  };
  expect_error([&] { model::from_hf_config(with("architectures", {"GPT2LMHeadModel"}), "c.json"); },
               {"c.json", "architectures", "GPT2LMHeadModel", "LlamaForCausalLM"});
  expect_error([&] { model::from_hf_config(with("model_type", "gpt2"), "c.json"); },
               {"model_type", "gpt2", "not supported"});
  expect_error([&] { model::from_hf_config(with("model_type", "qwen2"), "c.json"); },
               {"model_type", "qwen2", "LlamaForCausalLM", "different"});
  expect_error([&] { model::from_hf_config(with("rope_scaling", {{"rope_type", "yarn"}, {"factor", 4}}), "c.json"); },
               {"rope_scaling", "yarn"});
  expect_error([&] { model::from_hf_config(with("hidden_act", "gelu"), "c.json"); },
               {"hidden_act", "gelu"});
  expect_error([&] { model::from_hf_config(with("head_dim", 7), "c.json"); },
               {"head_dim must be even", "7"});
  expect_error([&] { model::from_hf_config(with("tie_word_embeddings", 1), "c.json"); },
               {"tie_word_embeddings"});
  json missing = base;
  missing.erase("intermediate_size");
  expect_error([&] { model::from_hf_config(missing, "c.json"); }, {"missing key intermediate_size"});
}

TEST(HfFamily, BadTensorsNameTheTensor) {
  TempDir dir;
  const train::LoadedModel a = train::load_model_dir(kFixture);
  const train::HfTensors named = train::hf_named_tensors(*a.params);
  auto write = [&](const std::string& case_name, auto edit) {
    const fs::path out = dir / case_name;
    fs::create_directories(out);
    fs::copy_file(kFixture / "config.json", out / "config.json");
    std::vector<safetensors::WriteTensor> w;
    for (const auto& t : named.tensors) w.push_back({t.name, t.shape, safetensors::DType::F32, t.data, nullptr});
    edit(w);
    safetensors::write_file(out / "model.safetensors", w);
    return out;
  };
  const fs::path missing = write("missing", [](auto& w) {
    w.erase(std::find_if(w.begin(), w.end(), [](auto& t) { return t.name == "model.layers.1.self_attn.k_proj.weight"; }));
  });
  expect_error([&] { train::load_model_dir(missing); }, {"model.layers.1.self_attn.k_proj.weight"});
  static const float extra_value = 1.f;
  const fs::path extra = write("extra", [](auto& w) {
    w.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", {1}, safetensors::DType::F32, &extra_value, nullptr});
  });
  expect_error([&] { train::load_model_dir(extra); }, {"model.layers.0.self_attn.rotary_emb.inv_freq", "not a parameter"});
  const fs::path shape = write("shape", [](auto& w) {
    for (auto& t : w)
      if (t.name == "model.layers.0.mlp.up_proj.weight") t.shape = {20, 48};
  });
  expect_error([&] { train::load_model_dir(shape); }, {"model.layers.0.mlp.up_proj.weight", "[40, 24]", "[20, 48]"});
  // An InternLM2 folder's names under a llama config.json: the first missing Llama name.
  const fs::path internlm2 = write("internlm2_names", [&](auto& w) {
    w.clear();
    for (const auto& v : a.layout->views())
      w.push_back({v.name, v.shape, safetensors::DType::F32, a.params->ptr(&v - a.layout->views().data()), nullptr});
  });
  expect_error([&] { train::load_model_dir(internlm2); }, {"model.embed_tokens.weight"});
}

TEST(HfFamily, TomlTypeMustAgreeWithConfigJson) {
  const model::ModelConfig f = model::read_hf_config(kFixture);
  model::ModelConfig toml;
  toml.type = "internlm2";
  expect_error([&] { model::merge_model_config(f, toml, {"type"}, "DIR/config.json"); },
               {"model.type = \"internlm2\"", "DIR/config.json", "model_type = \"llama\""});
  toml.type = "llama";
  EXPECT_EQ(model::merge_model_config(f, toml, {"type"}, "x").type, "llama");
  expect_error([] { model::check_model_type("gpt2", "model.type"); }, {"model.type", "gpt2", "llama"});
}

TEST(HfFamily, WritingRefusesWhatTheFormatCannotExpress) {
  model::ModelConfig c = model::read_hf_config(kFixture);
  c.qkv_bias = true;
  expect_error([&] { model::to_hf_config(c, 0, "llama"); }, {"attention_bias", "qkv_bias = true"});
  c.qkv_bias = false;
  expect_error([&] { model::to_hf_config(c, 0, "qwen2"); }, {"qwen2", "qkv_bias = false"});
  // Mistral: no window is written as null (absent would mean 4096 to Hugging Face).
  const json m = model::to_hf_config(c, 0, "mistral");
  ASSERT_TRUE(m.contains("sliding_window"));
  EXPECT_TRUE(m["sliding_window"].is_null());
  EXPECT_EQ(model::from_hf_config(m, "m").sliding_window, 0);
  json absent = m;
  absent.erase("sliding_window");
  EXPECT_EQ(model::from_hf_config(absent, "m").sliding_window, 4096);
  EXPECT_FALSE(model::to_hf_config(model::from_hf_config(absent, "m")).contains("sliding_window"))
      << "written back as read";
}

}  // namespace
}  // namespace longtron
