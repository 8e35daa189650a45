// The family table (see families.h).
#include "model/families.h"

#include <algorithm>

#include "core/error.h"

namespace longtron::model {
namespace {

constexpr const char* kFusedTargets[] = {"wqkv", "wo", "w1", "w3", "w2"};
constexpr const char* kSeparateTargets[] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                            "gate_proj", "up_proj", "down_proj"};

// The rows. Defaults are those of each family's configuration class in Hugging Face Transformers
// (InternLM2's is remote code: configuration_internlm2.py of the InternLM2 checkpoints).
constexpr Family kFamilies[] = {
    {.name = "InternLM2",
     .model_type = "internlm2",
     .architecture = "InternLM2ForCausalLM",
     .source = "modeling_internlm2.py, configuration_internlm2.py (remote code)",
     .names = TensorNames::kFused,
     .lora_targets = kFusedTargets,
     .block = {.biases = BiasKeys::kInternLM2, .rope_scaling = true, .tie_word_embeddings = true}},
    {.name = "Llama",
     .model_type = "llama",
     .architecture = "LlamaForCausalLM",
     .source = "models/llama/modeling_llama.py, configuration_llama.py",
     .lora_targets = kSeparateTargets,
     .block = {.biases = BiasKeys::kLlama, .head_dim = true, .rope_scaling = true,
               .tie_word_embeddings = true}},
    {.name = "Qwen2",
     .model_type = "qwen2",
     .architecture = "Qwen2ForCausalLM",
     .source = "models/qwen2/modeling_qwen2.py, configuration_qwen2.py",
     .lora_targets = kSeparateTargets,
     .block = {.biases = BiasKeys::kQkvOnly, .windows = WindowKeys::kFromLayer, .head_dim = true,
               .rope_scaling = true, .tie_word_embeddings = true},
     .default_window = 4096,
     .default_window_layers = 28},
    {.name = "Mistral",
     .model_type = "mistral",
     .architecture = "MistralForCausalLM",
     .source = "models/mistral/modeling_mistral.py, configuration_mistral.py",
     .lora_targets = kSeparateTargets,
     .block = {.biases = BiasKeys::kNone, .windows = WindowKeys::kEveryLayer, .head_dim = true,
               .rope_scaling = true, .tie_word_embeddings = true},
     .default_kv_heads = 8,
     .default_window = 4096},
    {.name = "Qwen3",
     .model_type = "qwen3",
     .architecture = "Qwen3ForCausalLM",
     .source = "models/qwen3/modeling_qwen3.py, configuration_qwen3.py",
     .lora_targets = kSeparateTargets,
     .block = {.biases = BiasKeys::kAttentionOnly, .windows = WindowKeys::kFromLayer,
               .head_dim = true, .rope_scaling = true, .tie_word_embeddings = true,
               .qk_norm = true},
     .default_kv_heads = 32,
     .default_head_dim = 128,
     .default_window = 4096,
     .default_window_layers = 28},
};

}  // namespace

std::span<const Family> families() { return kFamilies; }

const Family* find_family(std::string_view type) {
  for (const Family& f : kFamilies)
    if (type == f.model_type) return &f;
  return nullptr;
}

const Family& family(std::string_view type, std::string_view what) {
  const Family* f = find_family(type);
  check(f != nullptr, "{} = \"{}\": unsupported model type (supported: {})", what, type,
        family_list());
  return *f;
}

std::string family_list() {
  std::string s;
  for (const Family& f : kFamilies) s += std::string(s.empty() ? "" : ", ") + f.model_type;
  return s;
}

std::vector<std::string> window_families() {
  std::vector<std::string> out;
  for (const Family& f : kFamilies)
    if (f.block.windows != WindowKeys::kNone) out.emplace_back(f.model_type);
  std::sort(out.begin(), out.end());
  return out;
}

std::string or_list(const std::vector<std::string>& items, bool quoted) {
  std::string s;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) s += i + 1 == items.size() ? " or " : ", ";
    s += quoted ? "\"" + items[i] + "\"" : items[i];
  }
  return s;
}

std::vector<std::string> model_types() {
  std::vector<std::string> out;
  for (const Family& f : kFamilies) out.emplace_back(f.model_type);
  return out;
}

std::vector<const char*> family_keys(const Family& f) {
  std::vector<const char*> keys;
  switch (f.block.biases) {
    case BiasKeys::kInternLM2: keys = {"bias", "qkv_bias", "o_bias"}; break;
    case BiasKeys::kLlama: keys = {"attention_bias", "mlp_bias"}; break;
    case BiasKeys::kAttentionOnly: keys = {"attention_bias"}; break;
    case BiasKeys::kQkvOnly:
    case BiasKeys::kNone: break;
  }
  if (f.block.windows == WindowKeys::kFromLayer)
    keys.insert(keys.end(), {"use_sliding_window", "max_window_layers"});
  if (f.block.windows != WindowKeys::kNone) keys.push_back("sliding_window");
  return keys;
}

const char* names_family(TensorNames names) {
  for (const Family& f : kFamilies)
    if (f.names == names) return f.model_type;
  fail("no family names its tensors this way");  // every TensorNames value has a row
}

bool has_qk_norm(std::string_view type) {
  const Family* f = find_family(type);
  return f != nullptr && f->block.qk_norm;
}

std::vector<bool> window_layers_from(int64_t num_layers, int64_t first) {
  std::vector<bool> out(static_cast<size_t>(std::max<int64_t>(num_layers, 0)));
  for (int64_t l = 0; l < num_layers; ++l) out[static_cast<size_t>(l)] = l >= first;
  return out;
}

}  // namespace longtron::model
