// Hugging Face `config.json` for InternLM2 ↔ ModelConfig (Hugging Face transformers' InternLM2
// config; docs/model.md).
#pragma once
#include <nlohmann/json.hpp>

#include <filesystem>
#include <set>
#include <string>

#include "model/config.h"

namespace longtron::model {

/// The HF config of `config`: architectures ["InternLM2ForCausalLM"], model_type "internlm2",
/// hidden_size, intermediate_size (= ffn_size()), num_hidden_layers, num_attention_heads,
/// num_key_value_heads, rms_norm_eps, rope_theta, vocab_size, bias (= qkv_bias; HF InternLM2 has
/// one flag for wqkv and wo, so longtron also writes "qkv_bias"/"o_bias" which it prefers on
/// read), hidden_act "silu", tie_word_embeddings false, torch_dtype "float32";
/// max_position_embeddings when > 0.
nlohmann::json to_hf_config(const ModelConfig& config, int64_t max_position_embeddings = 0);

/// Reads the HF keys above (`source` names the file in messages). Throws Error naming the key when
/// one is missing or of the wrong type, or when architectures does not contain an InternLM2 class.
/// mlp_ratio/multiple_of are derived so that ffn_size() == intermediate_size exactly:
/// multiple_of = the largest power of two ≤ 256 dividing intermediate_size (256 for InternEvo
/// shapes), and mlp_ratio = intermediate_size / hidden_size, raised by a few ulps if needed so that
/// int(hidden × mlp_ratio) == intermediate_size exactly.
ModelConfig from_hf_config(const nlohmann::json& hf, const std::string& source);

/// File forms (`dir_or_file`: a folder holding config.json, or the file itself). Writing is atomic.
ModelConfig read_hf_config(const std::filesystem::path& dir_or_file);
void write_hf_config(const std::filesystem::path& file, const ModelConfig& config,
                     int64_t max_position_embeddings = 0);

/// The model of an --init-from / checkpoint run: `from_file` (read from config.json at `source`)
/// with the runtime-only options `checkpoint` and `dtype` taken from `toml`. Every key in `given`
/// (model.* key names as TrainConfig::model_keys_given) must agree with the file, else Error naming
/// the key and both values, e.g. "model.hidden_size = 512 in the TOML config but config.json (DIR) has
/// hidden_size = 384". mlp_ratio/multiple_of are compared through the FFN width they give.
ModelConfig merge_model_config(const ModelConfig& from_file, const ModelConfig& toml,
                               const std::set<std::string>& given, const std::string& source);

}  // namespace longtron::model
