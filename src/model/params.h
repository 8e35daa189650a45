// Parameters of a decoder model: one flat buffer with named views in Hugging Face naming order
// (docs/model.md), so that sharding, checkpoints and optimizer state are offset arithmetic.
// Gradients use the same layout in a second buffer.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/zeroed_buffer.h"
#include "model/model_config.h"

namespace longtron::model {

/// One named tensor inside the flat buffer.
struct ParamView {
  std::string name;            ///< Hugging Face name, e.g. "model.layers.0.attention.wqkv.weight"
  std::vector<int64_t> shape;  ///< row-major shape, e.g. {rows, cols} for a matrix
  int64_t offset = 0;          ///< first element inside the flat buffer
  int64_t numel = 0;           ///< product of shape
  int layer = -1;              ///< block index, -1 for embedding / final norm / head
  bool is_matrix = false;      ///< 2-D weight: takes weight decay and counts as matmul parameter
  bool is_norm = false;        ///< RMSNorm weight (init 1, no weight decay)
  bool is_bias = false;        ///< linear bias (init 0, no weight decay)
  bool is_embedding = false;   ///< the token embedding (a matrix, but not a matmul)
  double init_std = 0.0;       ///< std of the normal init (0 for norms and biases)
};

/// Indices (into ParamTable::views()) of the tensors of one block; -1 when absent (biases).
struct BlockParamIds {
  int attention_norm = -1, wqkv = -1, wqkv_bias = -1, wo = -1, wo_bias = -1;
  int ffn_norm = -1, w1 = -1, w3 = -1, w2 = -1;
  int w1_bias = -1, w3_bias = -1, w2_bias = -1;  ///< mlp_bias
  int q_norm = -1, k_norm = -1;  ///< per-head q and k RMSNorm weights [head_dim] (has_qk_norm)
};

/// The tensors of a model and where each lives in the flat buffer. Order (HF naming order):
/// model.tok_embeddings.weight [V,H]; per layer i: attention_norm.weight [H],
/// attention.wqkv.weight [(Hq+2Hkv)·d, H] (grouped rows, docs/model.md), attention.wqkv.bias
/// (qkv_bias), attention.wo.weight [H,H], attention.wo.bias (o_bias), attention.q_norm.weight and
/// attention.k_norm.weight [d] (families with per-head q/k norms, has_qk_norm), ffn_norm.weight [H],
/// feed_forward.w1.weight [F,H] (then feed_forward.w1.bias [F] with mlp_bias), feed_forward.w3.weight
/// [F,H] (w3.bias [F]), feed_forward.w2.weight [H,F] (w2.bias [H]);
/// then model.norm.weight [H], output.weight [V,H] (absent with tie_word_embeddings: output is
/// then the view index of model.tok_embeddings.weight).
/// Init std (InternEvo init_type "normal"): 0.02; wo and w2 of layer i 0.02/sqrt(2(i+1)).
class ParamTable {
 public:
  /// Throws longtron::Error naming the model.* key when the shape is impossible (non-positive
  /// sizes, heads not dividing hidden_size, kv heads not dividing heads).
  explicit ParamTable(const ModelConfig& config);

  const ModelConfig& config() const { return config_; }
  const std::vector<ParamView>& views() const { return views_; }
  const ParamView& view(int index) const { return views_.at(static_cast<size_t>(index)); }
  /// Total number of scalars.
  int64_t numel() const { return numel_; }
  /// Index of the view with this name, or -1.
  int find(std::string_view name) const;
  /// The view with this name; throws longtron::Error if there is none.
  const ParamView& at(std::string_view name) const;
  /// Parameters that take part in matmuls (every linear weight, head included; not the
  /// embedding, norms or biases) — the count of the FLOPs formula in docs/model.md.
  int64_t matmul_numel() const;
  /// The same tensors (names, order, flags, init std, view indices) with other shapes — one
  /// rank's shards (parallel/shard_plan.h) — and offsets recomputed. `shapes` has one entry per
  /// view; throws longtron::Error otherwise.
  ParamTable with_shapes(const std::vector<std::vector<int64_t>>& shapes) const;
  /// A table over the same config holding `views` instead (offsets recomputed, no block ids,
  /// embedding, norm or head): e.g. the LoRA adapter table (model/lora.h).
  ParamTable with_views(std::vector<ParamView> views) const;

  int tok_embeddings = -1;             ///< view index of model.tok_embeddings.weight
  int norm = -1;                       ///< view index of model.norm.weight
  int output = -1;  ///< view index of output.weight; == tok_embeddings when tie_word_embeddings
  std::vector<BlockParamIds> layers;   ///< per block

 private:
  int add(std::string name, std::vector<int64_t> shape, int layer, double init_std, bool is_norm,
          bool is_bias, bool is_embedding);
  ModelConfig config_;
  std::vector<ParamView> views_;
  int64_t numel_ = 0;
};

/// A flat buffer of T laid out by a ParamTable (parameters, gradients or optimizer moments).
/// Zero-initialised without being written (core/zeroed_buffer.h: the pages are zeroed at their
/// first write), so a buffer that is loaded or drawn next costs one pass. T is float (training)
/// or double (finite-difference tests).
template <typename T>
class Params {
 public:
  explicit Params(const ParamTable& layout);

  const ParamTable& layout() const { return *layout_; }
  T* data() { return data_.data(); }
  const T* data() const { return data_.data(); }
  int64_t numel() const { return static_cast<int64_t>(data_.size()); }
  /// Pointer to the first element of view `index` (nullptr for index -1, an absent bias).
  T* ptr(int index) { return index < 0 ? nullptr : data_.data() + layout_->view(index).offset; }
  const T* ptr(int index) const {
    return index < 0 ? nullptr : data_.data() + layout_->view(index).offset;
  }
  /// Pointer to the named view; throws longtron::Error if the name is unknown.
  T* get(std::string_view name) { return data_.data() + layout_->at(name).offset; }
  const T* get(std::string_view name) const { return data_.data() + layout_->at(name).offset; }
  /// Sets every element to 0 (the one place gradients are zeroed).
  void zero();

 private:
  const ParamTable* layout_;  // not owned; must outlive this object
  ZeroedBuffer<T> data_;
};

/// Fills `params` as InternEvo's init (docs/model.md): normal(0, view.init_std) for matrices, 1 for
/// norms, 0 for biases. Reproducible on every machine: tensor k (view index) draws from its own
/// std::mt19937_64 seeded with splitmix64(seed + k·0x9E3779B97F4A7C15), so one tensor's values do
/// not depend on the others' sizes (a sharded rank can rebuild a full tensor alone). Normals by
/// Box–Muller on pairs of uniforms u = (bits >> 11)·2⁻⁵³ ∈ [0,1): r = sqrt(−2 ln(1−u₁)), z₀ = r
/// cos(2πu₂), z₁ = r sin(2πu₂), used in that order; computed in double and rounded to T.
template <typename T>
void init_params(Params<T>& params, uint64_t seed);

/// The values init_params gives view `index` of a layout, whose full view is `view`, written to
/// out[view.numel] (one tensor of init_params: a sharded engine draws its tensors one at a time).
template <typename T>
void init_tensor(T* out, const ParamView& view, int index, uint64_t seed);

/// splitmix64 (Steele, Lea & Flood 2014): the seed mixer of init_params and of LoRA dropout's
/// mask (inline: the mask hashes every element of the adapters' inputs).
constexpr uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// The most layers a model may have (check_model_limits).
inline constexpr int64_t kMaxLayers = 65536;

/// Refuses model shapes too large to lay out: a width (vocab_size, hidden_size, the FFN width,
/// heads, multiple_of) above 2^40, more than 65536 layers, or more than 2^50 parameters (4 PiB in
/// fp32). Such numbers are typos; without this check the size arithmetic overflows 64 bits.
/// Messages start with "model.<key>: ". Assumes the sizes are already > 0.
void check_model_limits(const ModelConfig& config);

}  // namespace longtron::model
