// Model shape (docs/model.md). Key names follow InternEvo's config.py `model` section; the
// families it can be read from and written as are the rows of model/families.h.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/lora_config.h"

namespace longtron::model {

/// The shape of a model (docs/model.md). Defaults are InternEvo's.
struct ModelConfig {
  std::string type = "internlm2";  ///< a family's model_type (model/families.h): names and keys
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
  /// Llama's mlp_bias: biases on the FFN's gate, up ([F]) and down ([H]) projections (w1, w3, w2).
  bool mlp_bias = false;
  /// Hugging Face's tie_word_embeddings: the output head is the token embedding [V,H] itself (one
  /// tensor, one gradient = embedding's + head's); model.tie_word_embeddings or config.json.
  bool tie_word_embeddings = false;
  bool checkpoint = false;  ///< activation recomputation per block (InternEvo's name)
  /// Tokens per chunk of the recomputed blocks' token-wise parts (norms, linears, MLP, head and
  /// cross-entropy) with checkpoint on (docs/memory.md); also sizes the attention's groups.
  int64_t chunk_tokens = 4096;
  /// GEMM precision (InternEvo's model.dtype): "float32" | "bfloat16" | "auto", as
  /// ops::canonical_dtype spells them; ops::resolve_dtype turns it into the run's compute type.
  std::string dtype = "float32";
  /// Hugging Face's rope_scaling (model/rope_scaling.h), read from config.json: type "" (none),
  /// "linear", "llama3" or "dynamic", with its parameters.
  std::string rope_scaling_type;
  double rope_factor = 1.0;
  double rope_low_freq_factor = 1.0, rope_high_freq_factor = 4.0;  ///< llama3
  int64_t rope_original_max_position = 0;  ///< llama3: original_max_position_embeddings
  int64_t rope_max_position = 0;  ///< dynamic: max_position_embeddings (positions must stay below)
  /// Sliding-window attention (Hugging Face's sliding_window; 0 = none): a query sees the last
  /// sliding_window keys of its document, in the layers window_layers marks.
  int64_t sliding_window = 0;
  /// Per layer, whether it attends through the window (Hugging Face's layer_types:
  /// "sliding_attention" or "full_attention"), as the family fills it from config.json (Mistral:
  /// every layer; Qwen2: layers >= max_window_layers). Empty: every layer (model.sliding_window
  /// of the TOML); else num_layers entries.
  std::vector<bool> window_layers;
  /// The window of block `layer` (0 = full causal attention).
  int64_t window_of(int64_t layer) const {
    return window_layers.empty() || window_layers[static_cast<size_t>(layer)] ? sliding_window : 0;
  }
  /// Layers that attend through the window (0 without one).
  int64_t windowed_layers() const {
    if (sliding_window == 0) return 0;
    int64_t n = 0;
    for (int64_t l = 0; l < num_layers; ++l) n += window_of(l) > 0;
    return n;
  }
  /// The config.json read had no sliding_window key (Mistral's default 4096 applies): it is
  /// written back without one, as read.
  bool sliding_window_implicit = false;
  /// The keys of the config.json this model was read from that longtron does not model
  /// (torch_dtype, bos_token_id, max_position_embeddings, …), as the JSON text of an object ("" =
  /// none): written back unchanged so that config.json round-trips.
  std::string hf_extra;
  /// Low-rank adapters on this (then frozen) model (`[lora]`; rank 0 = none).
  LoraConfig lora;

  /// Hugging Face's head_dim when it differs from hidden_size / num_attention_heads (0: it does
  /// not); then q/k/v have heads × head_dim features and wo is [hidden_size, heads × head_dim].
  int64_t explicit_head_dim = 0;

  /// head_dim = explicit_head_dim, or hidden_size / num_attention_heads.
  int64_t head_dim() const {
    return explicit_head_dim > 0 ? explicit_head_dim : hidden_size / num_attention_heads;
  }
  /// Features of the attention output (wo's input): num_attention_heads × head_dim.
  int64_t attention_size() const { return num_attention_heads * head_dim(); }
  /// FFN width = multiple_of × ceil(int(hidden × mlp_ratio) / multiple_of) (InternEvo).
  int64_t ffn_size() const {
    const int64_t raw = static_cast<int64_t>(static_cast<double>(hidden_size) * mlp_ratio);
    return multiple_of * ((raw + multiple_of - 1) / multiple_of);
  }
  /// Rows of wqkv: (num_attention_heads + 2 × num_kv_attention_heads) × head_dim.
  int64_t qkv_size() const { return (num_attention_heads + 2 * num_kv_attention_heads) * head_dim(); }
};

}  // namespace longtron::model
