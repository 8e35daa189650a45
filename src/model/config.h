// InternLM2 model shape (docs/model.md). Key names follow InternEvo's config.py `model` section.
#pragma once
#include <cstdint>
#include <string>

namespace longtron::model {

/// The shape of an InternLM2 model (docs/model.md). Defaults are InternEvo's.
struct ModelConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_kv_attention_heads = 0;
  double mlp_ratio = 8.0 / 3.0;
  int64_t multiple_of = 256;
  double norm_eps = 1e-5;
  double rope_base = 10000.0;
  bool qkv_bias = false;
  bool o_bias = false;
  bool checkpoint = false;  ///< activation recomputation per block (InternEvo's name)
  /// GEMM precision (InternEvo's model.dtype): "float32" | "bfloat16" | "auto", as
  /// ops::canonical_dtype spells them; ops::resolve_dtype turns it into the run's compute type.
  std::string dtype = "float32";

  /// head_dim = hidden_size / num_attention_heads.
  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  /// FFN width = multiple_of × ceil(int(hidden × mlp_ratio) / multiple_of) (InternEvo).
  int64_t ffn_size() const {
    const int64_t raw = static_cast<int64_t>(static_cast<double>(hidden_size) * mlp_ratio);
    return multiple_of * ((raw + multiple_of - 1) / multiple_of);
  }
  /// Rows of wqkv: (num_attention_heads + 2 × num_kv_attention_heads) × head_dim.
  int64_t qkv_size() const { return (num_attention_heads + 2 * num_kv_attention_heads) * head_dim(); }
};

}  // namespace longtron::model
