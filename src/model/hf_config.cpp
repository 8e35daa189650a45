#include "model/hf_config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <string_view>
#include <utility>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/io_error.h"
#include "core/json_read.h"
#include "model/families.h"
#include "model/layer_types.h"
#include "model/params.h"
#include "model/rope_scaling.h"

namespace longtron::model {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string architecture_list() {
  std::string s;
  for (const Family& f : families()) s += std::string(s.empty() ? "" : ", ") + f.architecture;
  return s;
}

// Keys longtron models (read into ModelConfig, computed on write); every other key passes through.
const std::set<std::string>& modelled_keys() {
  static const std::set<std::string> keys = {
      "architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
      "num_attention_heads", "num_key_value_heads", "rms_norm_eps", "rope_theta", "vocab_size",
      "bias", "tie_word_embeddings"};
  return keys;
}

int64_t get_int(const json& j, const char* key, const std::string& source) {
  check(j.contains(key), "{}: missing key {}", source, key);
  check(j[key].is_number_integer(), "{}: {} must be an integer, got {}", source, key, json_excerpt(j[key]));
  return j[key].get<int64_t>();
}
int64_t get_int(const json& j, const char* key, const std::string& source, int64_t fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  return get_int(j, key, source);
}
double get_double(const json& j, const char* key, const std::string& source, double fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  check(j[key].is_number(), "{}: {} must be a number, got {}", source, key, json_excerpt(j[key]));
  return j[key].get<double>();
}
bool get_bool(const json& j, const char* key, const std::string& source, bool fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  check(j[key].is_boolean(), "{}: {} must be true or false, got {}", source, key, json_excerpt(j[key]));
  return j[key].get<bool>();
}

/// The family named by model_type and/or architectures (docs/model.md).
const Family& detect_family(const json& hf, const std::string& source) {
  const Family* from_type = nullptr;
  const Family* from_arch = nullptr;
  if (hf.contains("model_type")) {
    check(hf["model_type"].is_string(), "{}: model_type must be a string, got {}", source,
          json_excerpt(hf["model_type"]));
    const std::string type = hf["model_type"].get<std::string>();
    from_type = find_family(type);
    check(from_type != nullptr, "{}: model_type \"{}\" is not supported (supported: {})", source,
          type, family_list());
  }
  if (hf.contains("architectures")) {
    check(hf["architectures"].is_array(), "{}: architectures must be a list, got {}", source,
          json_excerpt(hf["architectures"]));
    for (const auto& a : hf["architectures"])
      for (const Family& f : families())
        if (a.is_string() && a.get<std::string>() == f.architecture && from_arch == nullptr)
          from_arch = &f;
    check(from_arch != nullptr, "{}: architectures {} is not supported (supported: {})", source,
          json_excerpt(hf["architectures"]), architecture_list());
  }
  // Both were read when both are set; otherwise the message is never formatted (a const json's
  // operator[] on a missing key is undefined behaviour, so no argument may touch one).
  if (from_type != nullptr && from_arch != nullptr)
    check(from_type == from_arch, "{}: model_type \"{}\" and architectures {} name different families",
          source, from_type->model_type, json_excerpt(hf["architectures"]));
  if (from_type == nullptr && from_arch == nullptr) return families().front();  // longtron's own
  return from_type != nullptr ? *from_type : *from_arch;
}

/// Refuses what family `f` does not train, naming the key.
void check_supported(const json& hf, const Family& f, const std::string& source) {
  if (hf.contains("hidden_act")) {
    check(hf["hidden_act"] == f.block.hidden_act, "{}: hidden_act {} is not supported (only \"{}\")",
          source, json_excerpt(hf["hidden_act"]), f.block.hidden_act);
  }
}

/// "a" or "an" before `word` as messages spell it ("an internlm2", "a llama").
const char* article(const std::string& word) {
  return std::string_view("aeiou").find(word.front()) != std::string_view::npos ? "an" : "a";
}

/// Refuses a model whose biases family `f`'s config.json cannot state.
void check_biases(const ModelConfig& c, const Family& f) {
  const std::string type = f.model_type;
  check(f.block.biases == BiasKeys::kLlama || !c.mlp_bias,
        "cannot write {} {} config.json: only Llama's config.json has mlp_bias, and this model has "
        "biases on its gate, up and down projections", article(type), type);
  switch (f.block.biases) {
    case BiasKeys::kInternLM2: break;  // any qkv_bias / o_bias pair
    case BiasKeys::kLlama:
    case BiasKeys::kAttentionOnly:
      check(c.qkv_bias == c.o_bias,
            "cannot write the {} config.json: its attention_bias covers q, k, v and o together, but "
            "this model has qkv_bias = {} and o_bias = {}", type, c.qkv_bias, c.o_bias);
      break;
    case BiasKeys::kQkvOnly:
      check(c.qkv_bias && !c.o_bias,
            "cannot write {} {} config.json: {} has a bias on q, k, v and none on o, but this model "
            "has qkv_bias = {} and o_bias = {}", article(type), type, f.name, c.qkv_bias, c.o_bias);
      break;
    case BiasKeys::kNone:
      check(!c.qkv_bias && !c.o_bias,
            "cannot write {} {} config.json: {} has no attention biases, but this model has "
            "qkv_bias = {} and o_bias = {}", article(type), type, f.name, c.qkv_bias, c.o_bias);
      break;
  }
}

/// Qwen2's max_window_layers for `c` (sliding_window > 0): its first windowed layer, or the value
/// config.json was read with (absent: `fallback`) when that names the same layers (e.g. 28 for a
/// 2-layer model where no layer slides), so that config.json round-trips as read.
int64_t max_window_layers(const ModelConfig& c, const json& source, int64_t fallback) {
  int64_t first = 0;
  while (first < c.num_layers && c.window_of(first) == 0) ++first;
  const json* read = source.contains("max_window_layers") ? &source["max_window_layers"] : nullptr;
  const int64_t as_read = read != nullptr && read->is_number_integer() ? read->get<int64_t>() : fallback;
  return std::min(as_read, c.num_layers) == first ? as_read : first;
}

/// Refuses a window family `f`'s config.json cannot state: none at all, or not on these layers.
void check_windows(const ModelConfig& c, const Family& f, const json& source) {
  if (c.sliding_window == 0) return;
  const std::string type = f.model_type;
  check(f.block.windows != WindowKeys::kNone, "cannot write the {} config.json: the model has a "
        "sliding window of {}", type, c.sliding_window);
  const Family* own = find_family(c.type);
  const int64_t first = max_window_layers(c, source, own ? own->default_window_layers : 0);
  check(f.block.windows != WindowKeys::kEveryLayer || c.windowed_layers() == c.num_layers,
        "cannot write {} {} config.json: its window covers every layer, this model's only layers "
        ">= {}", article(type), type, first);
  check(f.block.windows != WindowKeys::kFromLayer || source.contains("layer_types") ||
            c.windowed_layers() == c.num_layers - std::min(first, c.num_layers),
        "cannot write {} {} config.json: its window covers the layers from max_window_layers on, "
        "this model's are not such a range", article(type), type);
}

/// Writes the bias keys of family `f`: Hugging Face's own, plus longtron's finer InternLM2 pair
/// when it is needed or was read; a key the source lacked is added only to say something its
/// default does not.
void write_biases(json& j, const ModelConfig& c, const Family& f) {
  if (f.block.biases == BiasKeys::kInternLM2) {
    j["bias"] = c.qkv_bias;
    if (c.qkv_bias != c.o_bias || j.contains("qkv_bias") || j.contains("o_bias")) {
      j["qkv_bias"] = c.qkv_bias;
      j["o_bias"] = c.o_bias;
    }
  }
  if (f.block.biases == BiasKeys::kLlama || f.block.biases == BiasKeys::kAttentionOnly)
    if (c.qkv_bias || j.contains("attention_bias")) j["attention_bias"] = c.qkv_bias;
  if (f.block.biases == BiasKeys::kLlama)
    if (c.mlp_bias || j.contains("mlp_bias")) j["mlp_bias"] = c.mlp_bias;
}

/// Reads the biases as family `f`'s config.json states them.
void read_biases(const json& hf, const Family& f, ModelConfig& c, const std::string& source) {
  switch (f.block.biases) {
    case BiasKeys::kInternLM2: {
      const bool bias = get_bool(hf, "bias", source, false);
      c.qkv_bias = get_bool(hf, "qkv_bias", source, bias);
      c.o_bias = get_bool(hf, "o_bias", source, bias);
      break;
    }
    case BiasKeys::kLlama:
      c.qkv_bias = c.o_bias = get_bool(hf, "attention_bias", source, false);
      c.mlp_bias = get_bool(hf, "mlp_bias", source, false);  // LlamaMLP: gate/up/down bias
      break;
    case BiasKeys::kQkvOnly:  // Qwen2Attention: q/k/v_proj bias=True, o_proj bias=False
      c.qkv_bias = true;
      c.o_bias = false;
      break;
    case BiasKeys::kNone: break;  // MistralAttention's projections have bias=False
    case BiasKeys::kAttentionOnly:  // Qwen3Attention: q/k/v/o_proj bias=attention_bias
      c.qkv_bias = c.o_bias = get_bool(hf, "attention_bias", source, false);
      break;
  }
}

/// Reads the window and its layers as family `f`'s config.json states them.
void read_windows(const json& hf, const Family& f, ModelConfig& c, const std::string& source) {
  if (f.block.windows == WindowKeys::kEveryLayer) {
    // MistralConfig: sliding_window defaults to 4096; an explicit null means full attention.
    c.sliding_window_implicit = !hf.contains("sliding_window");
    c.sliding_window =
        c.sliding_window_implicit ? f.default_window : get_int(hf, "sliding_window", source, 0);
    check(c.sliding_window >= 0, "{}: sliding_window must be >= 0, got {}", source, c.sliding_window);
    c.window_layers.clear();  // every layer
  }
  if (f.block.windows == WindowKeys::kFromLayer && get_bool(hf, "use_sliding_window", source, false)) {
    // Qwen2Config: layers from max_window_layers on slide (null sliding_window: none).
    c.sliding_window = hf.contains("sliding_window") ? get_int(hf, "sliding_window", source, 0)
                                                     : f.default_window;
    const int64_t first = get_int(hf, "max_window_layers", source, f.default_window_layers);
    check(c.sliding_window >= 0 && first >= 0,
          "{}: sliding_window ({}) and max_window_layers ({}) must be >= 0", source, c.sliding_window,
          first);
    // One entry per layer: bounded first (a typo's 2^40 layers is refused later, by the layout).
    check(c.num_layers <= kMaxLayers, "{}: num_hidden_layers = {} is too large (at most {})", source,
          c.num_layers, kMaxLayers);
    c.window_layers = window_layers_from(c.num_layers, first);
  }
  // Transformers' Qwen2/Qwen3 configs: layer_types, when given, names the sliding layers itself
  // (max_window_layers then only fills it in when absent); checked even without a window.
  if (f.block.windows == WindowKeys::kFromLayer && hf.contains("layer_types") &&
      !hf["layer_types"].is_null()) {
    check(hf["layer_types"].is_array(), "{}: layer_types must be a list", source);
    std::vector<std::string> types;
    for (const json& t : hf["layer_types"]) {
      check(t.is_string(), "{}: layer_types must be a list of strings", source);
      types.push_back(t.get<std::string>());
    }
    const std::vector<bool> sliding = window_layers_from_types(types, c.num_layers, source);
    if (c.sliding_window > 0) c.window_layers = sliding;
  }
}

}  // namespace

std::string hf_architecture(const std::string& type) {
  const Family* f = find_family(type);
  check(f != nullptr, "model type \"{}\" is not supported (supported: {})", type, family_list());
  return f->architecture;
}

void check_model_type(const std::string& type, const std::string& what) { (void)family(type, what); }

json to_hf_config(const ModelConfig& c, int64_t max_position_embeddings, const std::string& format) {
  const std::string type = format.empty() ? c.type : format;
  const std::string arch = hf_architecture(type);
  const Family& f = *find_family(type);
  const json source =
      c.hf_extra.empty() ? json::object() : parse_json(c.hf_extra, "config.json's extra keys");
  json j = source;
  if (type != c.type) {  // the source family's own keys and remote code mean nothing to another
    j.erase("auto_map");
    for (const Family& other : families())
      for (const char* key : family_keys(other)) j.erase(key);
  }
  check_biases(c, f);
  check(c.explicit_head_dim == 0 || f.block.head_dim,
        "cannot write {} {} config.json: {} has no head_dim key, and this model's head_dim {} is "
        "not hidden_size / num_attention_heads", article(type), type, f.name, c.explicit_head_dim);
  check_windows(c, f, source);
  check(has_qk_norm(c.type) == f.block.qk_norm,
        "cannot write {} {} config.json: {} q_norm and k_norm (per-head RMSNorm of q and k), this "
        "model {}", article(type), type, f.block.qk_norm ? "it has" : "it has no",
        f.block.qk_norm ? "has none" : "has them");
  check(!c.tie_word_embeddings || f.block.tie_word_embeddings,
        "cannot write {} {} config.json: it has no tie_word_embeddings key, and this model's head is "
        "its token embedding", article(type), type);
  if (f.block.windows == WindowKeys::kFromLayer && c.sliding_window > 0) {
    const Family* own = find_family(c.type);
    j["use_sliding_window"] = true;
    j["sliding_window"] = c.sliding_window;
    j["max_window_layers"] = max_window_layers(c, source, own ? own->default_window_layers : 0);
    if (source.contains("layer_types")) {  // read so: written back from the model's layers
      json types = json::array();
      for (int64_t l = 0; l < c.num_layers; ++l)
        types.push_back(c.window_of(l) > 0 ? "sliding_attention" : "full_attention");
      j["layer_types"] = types;
    }
  }
  j["architectures"] = {arch};
  j["model_type"] = type;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.ffn_size();
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_kv_attention_heads;
  j["rms_norm_eps"] = c.norm_eps;
  j["rope_theta"] = c.rope_base;
  j["vocab_size"] = c.vocab_size;
  if (c.explicit_head_dim > 0) j["head_dim"] = c.explicit_head_dim;
  // Absent, head_dim means the family's default (Qwen3Config: 128), not hidden / heads.
  if (f.default_head_dim > 0 && !j.contains("head_dim")) j["head_dim"] = c.head_dim();
  write_biases(j, c, f);
  // Absent means the default (4096) to Hugging Face's MistralConfig, so "none" must be written as null.
  if (f.block.windows == WindowKeys::kEveryLayer && !j.contains("sliding_window") &&
      !(c.sliding_window_implicit && c.sliding_window == f.default_window))
    j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
  if (!j.contains("hidden_act")) j["hidden_act"] = f.block.hidden_act;
  if (f.block.tie_word_embeddings) j["tie_word_embeddings"] = c.tie_word_embeddings;
  if (!j.contains("torch_dtype")) j["torch_dtype"] = "float32";
  if (max_position_embeddings > 0 && !j.contains("max_position_embeddings"))
    j["max_position_embeddings"] = max_position_embeddings;
  return j;
}

ModelConfig from_hf_config(const json& hf, const std::string& source) {
  check(hf.is_object(), "{}: not a JSON object", source);
  ModelConfig c;
  const Family& f = detect_family(hf, source);
  c.type = f.model_type;
  check_supported(hf, f, source);
  c.hidden_size = get_int(hf, "hidden_size", source);
  c.num_layers = get_int(hf, "num_hidden_layers", source);
  c.num_attention_heads = get_int(hf, "num_attention_heads", source);
  c.num_kv_attention_heads = get_int(hf, "num_key_value_heads", source,
                                     f.default_kv_heads > 0 && !hf.contains("num_key_value_heads")
                                         ? f.default_kv_heads : c.num_attention_heads);
  c.vocab_size = get_int(hf, "vocab_size", source);
  const int64_t inter = get_int(hf, "intermediate_size", source);
  check(c.hidden_size > 0 && inter > 0, "{}: hidden_size {} and intermediate_size {} must be > 0",
        source, c.hidden_size, inter);
  check(c.num_attention_heads > 0, "{}: num_attention_heads must be > 0, got {}", source,
        c.num_attention_heads);
  // The rest of the shape, checked here under config.json's own key names (a folder read by eval,
  // generate or export is checked nowhere else before its numbers reach the kernels).
  check(c.num_layers > 0, "{}: num_hidden_layers must be > 0, got {}", source, c.num_layers);
  check(c.vocab_size > 0, "{}: vocab_size must be > 0, got {}", source, c.vocab_size);
  check(c.num_kv_attention_heads > 0 && c.num_attention_heads % c.num_kv_attention_heads == 0,
        "{}: num_key_value_heads must be > 0 and divide num_attention_heads {}, got {}{}", source,
        c.num_attention_heads, c.num_kv_attention_heads,
        hf.contains("num_key_value_heads") ? "" : fmt::format(" (the key is absent: {}'s default)",
                                                              f.name));
  // Bounded before the arithmetic below: a product of two of them would overflow int64, and an
  // intermediate_size near 2^63 would make the mlp_ratio search convert 2^63 back to int64.
  // 2^40 is check_model_limits' bound (model/params.h), which the layout applies later anyway.
  constexpr int64_t kMaxModelWidth = int64_t{1} << 40;
  const std::pair<const char*, int64_t> widths[] = {
      {"hidden_size", c.hidden_size}, {"intermediate_size", inter},
      {"num_attention_heads", c.num_attention_heads}, {"vocab_size", c.vocab_size}};
  for (const auto& [key, v] : widths)
    check(v <= kMaxModelWidth, "{}: {} = {} is too large (at most 2^40)", source, key, v);
  const bool head_dim_key = hf.contains("head_dim") && !hf["head_dim"].is_null();
  if (head_dim_key || f.default_head_dim > 0) {  // kept in hf_extra as read
    const int64_t d = head_dim_key ? get_int(hf, "head_dim", source) : f.default_head_dim;
    check(d > 0 && d % 2 == 0 && d <= kMaxModelWidth,
          "{}: head_dim must be even, > 0 and at most 2^40, got {}", source, d);
    if (c.hidden_size % c.num_attention_heads != 0 || c.hidden_size / c.num_attention_heads != d)
      c.explicit_head_dim = d;
  }
  c.multiple_of = 256;
  while (inter % c.multiple_of != 0) c.multiple_of /= 2;
  // Nudge the ratio by ulps so that int(hidden × ratio) is exactly intermediate_size (the plain
  // quotient can land one ulp low, e.g. 100 × 0.29 = 28.999…), whatever multiple_of divides it.
  c.mlp_ratio = double(inter) / double(c.hidden_size);
  while (int64_t(double(c.hidden_size) * c.mlp_ratio) < inter)
    c.mlp_ratio = std::nextafter(c.mlp_ratio, 2 * c.mlp_ratio);
  check(c.ffn_size() == inter, "{}: cannot express intermediate_size {} (internal error)", source, inter);
  c.norm_eps = get_double(hf, "rms_norm_eps", source, f.default_rms_norm_eps);
  c.rope_base = read_rope_theta(hf, f.default_rope_theta, source);
  check(std::isfinite(c.norm_eps) && c.norm_eps > 0, "{}: rms_norm_eps must be finite and > 0, got {}",
        source, c.norm_eps);
  if (f.block.rope_scaling) read_rope_scaling(hf, c, source);  // kept in hf_extra too: written back as read
  if (f.block.tie_word_embeddings) c.tie_word_embeddings = get_bool(hf, "tie_word_embeddings", source, false);
  read_biases(hf, f, c, source);
  read_windows(hf, f, c, source);
  json extra = json::object();
  for (const auto& [key, value] : hf.items())
    if (!modelled_keys().count(key)) extra[key] = value;
  c.hf_extra = extra.empty() ? "" : extra.dump();
  return c;
}

ModelConfig read_hf_config(const fs::path& dir_or_file) {
  const fs::path file = fs::is_directory(dir_or_file) ? dir_or_file / "config.json" : dir_or_file;
  check(std::ifstream(file).good(), "{}: cannot open (a Hugging Face folder needs config.json)",
        file.string());
  return from_hf_config(read_json_file(file), file.string());
}

void write_hf_config(const fs::path& file, const ModelConfig& config, int64_t max_position_embeddings,
                     const std::string& format) {
  const std::string text = to_hf_config(config, max_position_embeddings, format).dump(2) + "\n";
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
  check(!given.count("type") || toml.type == f.type,
        "model.type = \"{}\" in the TOML config but {} has model_type = \"{}\"", toml.type, source,
        f.type);
  same_int("vocab_size", "vocab_size", toml.vocab_size, f.vocab_size);
  same_int("hidden_size", "hidden_size", toml.hidden_size, f.hidden_size);
  same_int("num_layers", "num_hidden_layers", toml.num_layers, f.num_layers);
  same_int("num_attention_heads", "num_attention_heads", toml.num_attention_heads,
           f.num_attention_heads);
  same_int("num_kv_attention_heads", "num_key_value_heads", toml.num_kv_attention_heads,
           f.num_kv_attention_heads);
  same_int("head_dim", "head_dim", toml.explicit_head_dim, f.explicit_head_dim);
  same_int("sliding_window", "sliding_window", toml.sliding_window, f.sliding_window);
  same_real("norm_eps", "rms_norm_eps", toml.norm_eps, f.norm_eps);
  same_real("rope_base", "rope_theta", toml.rope_base, f.rope_base);
  same_bool("qkv_bias", toml.qkv_bias, f.qkv_bias);
  same_bool("o_bias", toml.o_bias, f.o_bias);
  same_bool("mlp_bias", toml.mlp_bias, f.mlp_bias);
  same_bool("tie_word_embeddings", toml.tie_word_embeddings, f.tie_word_embeddings);
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
