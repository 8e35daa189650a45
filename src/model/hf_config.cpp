#include "model/hf_config.h"

#include <cmath>
#include <fstream>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/io_error.h"

namespace longtron::model {
namespace fs = std::filesystem;
using nlohmann::json;

json to_hf_config(const ModelConfig& c, int64_t max_position_embeddings) {
  json j = {{"architectures", {"InternLM2ForCausalLM"}},
            {"model_type", "internlm2"},
            {"hidden_size", c.hidden_size},
            {"intermediate_size", c.ffn_size()},
            {"num_hidden_layers", c.num_layers},
            {"num_attention_heads", c.num_attention_heads},
            {"num_key_value_heads", c.num_kv_attention_heads},
            {"rms_norm_eps", c.norm_eps},
            {"rope_theta", c.rope_base},
            {"vocab_size", c.vocab_size},
            {"bias", c.qkv_bias},
            {"qkv_bias", c.qkv_bias},
            {"o_bias", c.o_bias},
            {"hidden_act", "silu"},
            {"tie_word_embeddings", false},
            {"torch_dtype", "float32"}};
  if (max_position_embeddings > 0) j["max_position_embeddings"] = max_position_embeddings;
  return j;
}

namespace {
int64_t get_int(const json& j, const char* key, const std::string& source) {
  check(j.contains(key), "{}: missing key {}", source, key);
  check(j[key].is_number_integer(), "{}: {} must be an integer, got {}", source, key, j[key].dump());
  return j[key].get<int64_t>();
}
double get_double(const json& j, const char* key, const std::string& source, double fallback) {
  if (!j.contains(key)) return fallback;
  check(j[key].is_number(), "{}: {} must be a number, got {}", source, key, j[key].dump());
  return j[key].get<double>();
}
bool get_bool(const json& j, const char* key, const std::string& source, bool fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  check(j[key].is_boolean(), "{}: {} must be true or false, got {}", source, key, j[key].dump());
  return j[key].get<bool>();
}
}  // namespace

ModelConfig from_hf_config(const json& hf, const std::string& source) {
  check(hf.is_object(), "{}: not a JSON object", source);
  if (hf.contains("architectures")) {
    bool ok = false;
    for (const auto& a : hf["architectures"])
      ok |= a.is_string() && a.get<std::string>().rfind("InternLM2", 0) == 0;
    check(ok, "{}: architectures {} is not InternLM2ForCausalLM", source, hf["architectures"].dump());
  }
  ModelConfig c;
  c.hidden_size = get_int(hf, "hidden_size", source);
  c.num_layers = get_int(hf, "num_hidden_layers", source);
  c.num_attention_heads = get_int(hf, "num_attention_heads", source);
  c.num_kv_attention_heads =
      hf.contains("num_key_value_heads") ? get_int(hf, "num_key_value_heads", source)
                                         : c.num_attention_heads;
  c.vocab_size = get_int(hf, "vocab_size", source);
  const int64_t inter = get_int(hf, "intermediate_size", source);
  check(c.hidden_size > 0 && inter > 0, "{}: hidden_size {} and intermediate_size {} must be > 0",
        source, c.hidden_size, inter);
  c.multiple_of = 256;
  while (inter % c.multiple_of != 0) c.multiple_of /= 2;
  // Nudge the ratio by ulps so that int(hidden × ratio) is exactly intermediate_size (the plain
  // quotient can land one ulp low, e.g. 100 × 0.29 = 28.999…), whatever multiple_of divides it.
  c.mlp_ratio = double(inter) / double(c.hidden_size);
  while (int64_t(double(c.hidden_size) * c.mlp_ratio) < inter)
    c.mlp_ratio = std::nextafter(c.mlp_ratio, 2 * c.mlp_ratio);
  check(c.ffn_size() == inter, "{}: cannot express intermediate_size {} (internal error)", source, inter);
  c.norm_eps = get_double(hf, "rms_norm_eps", source, 1e-6);
  c.rope_base = get_double(hf, "rope_theta", source, 10000.0);
  const bool bias = get_bool(hf, "bias", source, false);
  c.qkv_bias = get_bool(hf, "qkv_bias", source, bias);
  c.o_bias = get_bool(hf, "o_bias", source, bias);
  return c;
}

ModelConfig read_hf_config(const fs::path& dir_or_file) {
  const fs::path file = fs::is_directory(dir_or_file) ? dir_or_file / "config.json" : dir_or_file;
  std::ifstream in(file);
  check(in.good(), "{}: cannot open (a Hugging Face folder needs config.json)", file.string());
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", file.string(), e.what());
  }
  return from_hf_config(j, file.string());
}

void write_hf_config(const fs::path& file, const ModelConfig& config, int64_t max_position_embeddings) {
  const std::string text = to_hf_config(config, max_position_embeddings).dump(2) + "\n";
  write_atomically(file, [&](const fs::path& tmp) {
    std::ofstream out(tmp);
    out << text;
    out.close();
    check(out.good(), "{}: write failed ({})", file.string(), io_error_text());
  });
}

ModelConfig merge_model_config(const ModelConfig& f, const ModelConfig& toml,
                               const std::set<std::string>& given, const std::string& source) {
  auto same_int = [&](const char* key, const char* hf_key, int64_t mine, int64_t theirs) {
    check(!given.count(key) || mine == theirs, "model.{} = {} in the TOML config but {} has {} = {}",
          key, mine, source, hf_key, theirs);
  };
  auto same_real = [&](const char* key, const char* hf_key, double mine, double theirs) {
    check(!given.count(key) || std::fabs(mine - theirs) <= 1e-12 * std::fabs(theirs),
          "model.{} = {} in the TOML config but {} has {} = {}", key, mine, source, hf_key, theirs);
  };
  auto same_bool = [&](const char* key, bool mine, bool theirs) {
    check(!given.count(key) || mine == theirs, "model.{} = {} in the TOML config but {} has {} = {}",
          key, mine, source, key, theirs);
  };
  same_int("vocab_size", "vocab_size", toml.vocab_size, f.vocab_size);
  same_int("hidden_size", "hidden_size", toml.hidden_size, f.hidden_size);
  same_int("num_layers", "num_hidden_layers", toml.num_layers, f.num_layers);
  same_int("num_attention_heads", "num_attention_heads", toml.num_attention_heads,
           f.num_attention_heads);
  same_int("num_kv_attention_heads", "num_key_value_heads", toml.num_kv_attention_heads,
           f.num_kv_attention_heads);
  same_real("norm_eps", "rms_norm_eps", toml.norm_eps, f.norm_eps);
  same_real("rope_base", "rope_theta", toml.rope_base, f.rope_base);
  same_bool("qkv_bias", toml.qkv_bias, f.qkv_bias);
  same_bool("o_bias", toml.o_bias, f.o_bias);
  if (given.count("mlp_ratio") || given.count("multiple_of")) {
    ModelConfig probe = toml;
    probe.hidden_size = f.hidden_size;
    check(probe.ffn_size() == f.ffn_size(),
          "model.mlp_ratio = {} and model.multiple_of = {} in the TOML config give an FFN width of "
          "{} but {} has intermediate_size = {}", toml.mlp_ratio, toml.multiple_of, probe.ffn_size(),
          source, f.ffn_size());
  }
  ModelConfig out = f;
  out.checkpoint = toml.checkpoint;
  out.dtype = toml.dtype;  // how to train, not what the model is
  return out;
}

}  // namespace longtron::model
