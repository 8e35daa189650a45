// The Hugging Face families longtron reads and writes, one row of data each (docs/families.md,
// generated from this table): the family's names (model_type, architectures), its config.json
// keys and their defaults, what its config.json can express, how its tensors are named, which
// linears PEFT adapts, and its block's options. Import (model/hf_config), export (model/hf_names,
// cli/export), the LoRA targets (model/lora, train/peft) and the docs read these rows; other
// code asks a family's row what it can do instead of comparing its name. Every family runs the
// same pre-norm RMSNorm / RoPE / GQA / GLU decoder (Qwen3 adds its per-head q/k norms);
// docs/model.md says which fields a new family (Gemma 3) would add.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace longtron::model {

/// How a family names a block's tensors in its folders (model/hf_names.h).
enum class TensorNames {
  /// InternLM2 (modeling_internlm2.py): attention.wqkv fused and grouped per kv head,
  /// attention.wo, feed_forward.w1/w3/w2, attention_norm, ffn_norm; model.tok_embeddings, output.
  /// The engine's own layout: one tensor per parameter view.
  kFused,
  /// Llama (modeling_llama.py): self_attn.q/k/v/o_proj, mlp.gate/up/down_proj, input_layernorm,
  /// post_attention_layernorm; model.embed_tokens, lm_head. q/k/v are gathered from / scattered
  /// into the engine's fused wqkv.
  kSeparate,
};

/// How a family's config.json states the block's biases (ModelConfig::qkv_bias, o_bias, mlp_bias).
enum class BiasKeys {
  /// "bias" (q/k/v and o), with longtron's finer "qkv_bias" / "o_bias" when they differ (InternLM2).
  kInternLM2,
  /// "attention_bias" (q, k, v and o together) and "mlp_bias" (gate, up, down) (LlamaConfig).
  kLlama,
  /// No key: q/k/v always carry a bias, o never (Qwen2Attention: q/k/v_proj bias=True).
  kQkvOnly,
  /// No key: no bias anywhere (MistralAttention, MistralMLP: bias=False).
  kNone,
  /// "attention_bias" (q, k, v and o together); the MLP never has one (Qwen3Attention, Qwen3MLP).
  kAttentionOnly,
};

/// How a family's config.json states which layers attend through a sliding window.
enum class WindowKeys {
  kNone,  ///< no key: full causal attention in every layer
  /// "sliding_window" in every layer: absent = Family::default_window, null = none (MistralConfig).
  kEveryLayer,
  /// Only with "use_sliding_window": true, "sliding_window" (absent: Family::default_window) in
  /// layers >= "max_window_layers" (absent: Family::default_window_layers) (Qwen2Config).
  kFromLayer,
};

/// The block's options a family's config.json can express (model/layers.h builds the block).
struct BlockOptions {
  /// The one hidden_act of the FFN's gate (written when the source had none; another is refused):
  /// "silu", i.e. SwiGLU, w2(silu(w1 z) ⊙ w3 z).
  const char* hidden_act = "silu";
  BiasKeys biases = BiasKeys::kNone;    ///< which biases, under which keys
  WindowKeys windows = WindowKeys::kNone;  ///< which layers slide, under which keys
  bool head_dim = false;  ///< a "head_dim" key may differ from hidden_size / num_attention_heads
  bool rope_scaling = false;         ///< "rope_scaling" (model/rope_scaling.h) is read
  bool tie_word_embeddings = false;  ///< "tie_word_embeddings" (written always)
  /// RMSNorm of each query and key head over head_dim after the projections, before RoPE, one
  /// weight [head_dim] for q and one for k shared by all heads (Qwen3Attention's q_norm, k_norm).
  bool qk_norm = false;
};

/// One family: a row of families().
struct Family {
  const char* name;          ///< as messages and docs write it ("InternLM2", "Qwen2")
  const char* model_type;    ///< config.json's model_type, and ModelConfig::type
  const char* architecture;  ///< config.json's architectures entry
  const char* source;        ///< the Hugging Face Transformers files this row follows
  TensorNames names = TensorNames::kSeparate;
  /// PEFT's target_modules names of the block's linears in block order (lora.targets; LoRA
  /// dropout numbers the modules by this order): the last part of their tensor names.
  std::span<const char* const> lora_targets;
  BlockOptions block;
  // config.json's defaults of the keys longtron models, where the key is absent.
  double default_rms_norm_eps = 1e-6;
  double default_rope_theta = 10000.0;
  int64_t default_kv_heads = 0;  ///< num_key_value_heads (0: num_attention_heads)
  int64_t default_head_dim = 0;  ///< head_dim (0: hidden_size / num_attention_heads)
  int64_t default_window = 0;    ///< sliding_window (kEveryLayer, kFromLayer)
  int64_t default_window_layers = 0;  ///< max_window_layers (kFromLayer)
};

/// Every family, in the order messages list them (internlm2, llama, qwen2, mistral, qwen3).
std::span<const Family> families();

/// The row whose model_type is `type`; nullptr when there is none.
const Family* find_family(std::string_view type);

/// The row whose model_type is `type`. Throws Error "<what> = "<type>": unsupported model type
/// (supported: internlm2, llama, qwen2, mistral, qwen3)" when there is none.
const Family& family(std::string_view type, std::string_view what);

/// Every model type, in table order.
std::vector<std::string> model_types();

/// The model types, ", "-separated in table order ("internlm2, llama, qwen2, mistral, qwen3").
std::string family_list();

/// The config.json keys that belong to family `f`'s options (its bias and window keys, e.g.
/// "attention_bias", "mlp_bias" for Llama): dropped when a model is written as another family.
std::vector<const char*> family_keys(const Family& f);

/// The model types of the families whose config.json can state a sliding window, in alphabetical
/// order ("mistral", "qwen2", "qwen3").
std::vector<std::string> window_families();

/// `items` as a sentence lists them: "a", "a or b", "a, b or c"; `quoted`: each in double quotes.
std::string or_list(const std::vector<std::string>& items, bool quoted = false);

/// The model type of the first row whose tensors are named `names` (kFused: "internlm2",
/// kSeparate: "llama"): the family that stands for a naming where only the naming matters (the
/// adapter conversions of train/peft.h).
const char* names_family(TensorNames names);

/// Whether a model of type `type` normalises each query and key head (BlockOptions::qk_norm of
/// its family; false for a type that is no family's).
bool has_qk_norm(std::string_view type);

/// The windowed layers of a model of `num_layers` layers whose window starts at layer `first`
/// (Qwen2's max_window_layers; 0: every layer, >= num_layers: none), for ModelConfig::window_layers.
std::vector<bool> window_layers_from(int64_t num_layers, int64_t first);

/// docs/families.md: a table of every family's row, its config.json keys, tensor names and LoRA
/// targets (`longtron config --families-markdown`; families_test fails while the page is stale).
std::string families_markdown();

}  // namespace longtron::model
