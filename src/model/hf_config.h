// Hugging Face `config.json` ↔ ModelConfig for the families of model/families.h (Hugging Face
// transformers' InternLM2, Llama, Qwen2 and Mistral configurations; docs/families.md): which keys
// a family has, their defaults and what it can express are the family's row; this file applies them.
#pragma once
#include <nlohmann/json.hpp>

#include <filesystem>
#include <set>
#include <string>

#include "model/model_config.h"

namespace longtron::model {

/// The `architectures` class of a model type ("llama" → "LlamaForCausalLM"); throws Error naming
/// the type and listing the supported ones when no family has it.
std::string hf_architecture(const std::string& type);

/// Throws Error "<what> = "<type>": unsupported model type (supported: internlm2, llama, qwen2,
/// mistral)" unless a family (model/families.h) has model_type `type`.
void check_model_type(const std::string& type, const std::string& what);

/// The HF config of `config` written as family `format` (empty = config.type). Starts from the
/// keys the model was read with (config.hf_extra, passed through unchanged), then sets the keys
/// longtron models: architectures, model_type, hidden_size, intermediate_size (= ffn_size()),
/// num_hidden_layers, num_attention_heads, num_key_value_heads, rms_norm_eps, rope_theta,
/// vocab_size, tie_word_embeddings (always written) and the family's bias keys (InternLM2: bias, and qkv_bias/o_bias when they differ or
/// were read; Llama: attention_bias and mlp_bias, each when true or read; Qwen2: none, its q/k/v always carry a bias;
/// Mistral: none, it has no biases; Family::block.biases). Adds hidden_act "silu",
/// torch_dtype "float32" and max_position_embeddings (when > 0) only
/// where the source config lacked them. Writing as another family drops the source's `auto_map`
/// (remote code) and every family's own keys (model::family_keys: bias, qkv_bias, o_bias,
/// attention_bias, mlp_bias, use_sliding_window, max_window_layers, sliding_window), then writes
/// the target's: Qwen2's max_window_layers is the first windowed layer, or the value read when it
/// names the same layers. Throws Error when `format` cannot express the model (biases Llama cannot write,
/// a Qwen2 without q/k/v bias, a sliding window outside Mistral and Qwen2, a window on other
/// layers than the family's keys can name, mlp_bias outside Llama).
nlohmann::json to_hf_config(const ModelConfig& config, int64_t max_position_embeddings = 0,
                            const std::string& format = "");

/// Reads a config.json (`source` names the file in messages). The family comes from `model_type`
/// and `architectures` (both, when present, must name the same one; neither: internlm2); an
/// unknown one is an Error naming the value. Throws Error naming the key when one is missing or of the wrong type, or asks
/// for what longtron does not train: hidden_act other than silu, a rope_scaling type other than
/// linear, llama3 and dynamic, an odd head_dim. Llama's mlp_bias (default false) sets
/// ModelConfig::mlp_bias. tie_word_embeddings (default false)
/// sets ModelConfig::tie_word_embeddings (ParamTable then has no separate head tensor). Missing optional keys take Hugging Face's defaults (rms_norm_eps 1e-6,
/// rope_theta 10000, num_key_value_heads = num_attention_heads; Mistral: 8 and sliding_window
/// 4096, while "sliding_window": null means none; the Family row's defaults). The family fills
/// ModelConfig::window_layers: Mistral every layer, Qwen2 (use_sliding_window) the layers >=
/// max_window_layers (default 28; more than kMaxLayers layers is then an Error). Keys not
/// modelled are kept in hf_extra.
/// mlp_ratio/multiple_of are derived so that ffn_size() == intermediate_size exactly:
/// multiple_of = the largest power of two ≤ 256 dividing intermediate_size (256 for InternEvo
/// shapes), and mlp_ratio = intermediate_size / hidden_size, raised by a few ulps if needed so that
/// int(hidden × mlp_ratio) == intermediate_size exactly.
ModelConfig from_hf_config(const nlohmann::json& hf, const std::string& source);

/// File forms (`dir_or_file`: a folder holding config.json, or the file itself). Writing is atomic.
ModelConfig read_hf_config(const std::filesystem::path& dir_or_file);
void write_hf_config(const std::filesystem::path& file, const ModelConfig& config,
                     int64_t max_position_embeddings = 0, const std::string& format = "");

/// The model of an --init-from / checkpoint run: `from_file` (read from config.json at `source`)
/// with the runtime-only options `checkpoint` and `dtype` taken from `toml`. Every key in `given`
/// (model.* key names as TrainConfig::model_keys_given) must agree with the file, else Error naming
/// the key and both values, e.g. "model.hidden_size = 512 in the TOML config but config.json (DIR) has
/// hidden_size = 384" or "model.type = "internlm2" in the TOML config but … has model_type =
/// "llama"". mlp_ratio/multiple_of are compared through the FFN width they give.
ModelConfig merge_model_config(const ModelConfig& from_file, const ModelConfig& toml,
                               const std::set<std::string>& given, const std::string& source);

}  // namespace longtron::model
