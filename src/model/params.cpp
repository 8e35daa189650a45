// Parameter layout, flat buffers and the reproducible init of docs/model.md.
#include "model/params.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <random>
#include <utility>

#include "core/error.h"
#include "model/families.h"

namespace longtron::model {
namespace {

void check_config(const ModelConfig& c) {
  check(c.vocab_size > 0, "model.vocab_size must be positive, got {}", c.vocab_size);
  check(c.hidden_size > 0, "model.hidden_size must be positive, got {}", c.hidden_size);
  check(c.num_layers > 0, "model.num_layers must be positive, got {}", c.num_layers);
  check(c.num_attention_heads > 0, "model.num_attention_heads must be positive, got {}",
        c.num_attention_heads);
  check(c.num_kv_attention_heads > 0, "model.num_kv_attention_heads must be positive, got {}",
        c.num_kv_attention_heads);
  check(c.explicit_head_dim > 0 || c.hidden_size % c.num_attention_heads == 0,
        "model.num_attention_heads ({}) must divide model.hidden_size ({})",
        c.num_attention_heads, c.hidden_size);
  check(c.num_attention_heads % c.num_kv_attention_heads == 0,
        "model.num_kv_attention_heads ({}) must divide model.num_attention_heads ({})",
        c.num_kv_attention_heads, c.num_attention_heads);
  check(c.explicit_head_dim >= 0, "model.head_dim must be >= 0, got {}", c.explicit_head_dim);
  check(c.head_dim() % 2 == 0, "head_dim = {} = {} must be even for RoPE",
        c.explicit_head_dim > 0 ? "model.head_dim" : "model.hidden_size / model.num_attention_heads",
        c.head_dim());
  check(c.mlp_ratio > 0, "model.mlp_ratio must be positive, got {}", c.mlp_ratio);
  check(c.multiple_of > 0, "model.multiple_of must be positive, got {}", c.multiple_of);
  check_model_limits(c);
}

}  // namespace

void check_model_limits(const ModelConfig& c) {
  constexpr int64_t kMaxWidth = int64_t{1} << 40;
  constexpr double kMaxParams = 1125899906842624.0;  // 2^50
  const std::pair<const char*, int64_t> widths[] = {
      {"vocab_size", c.vocab_size}, {"hidden_size", c.hidden_size},
      {"num_attention_heads", c.num_attention_heads},
      {"num_kv_attention_heads", c.num_kv_attention_heads}, {"multiple_of", c.multiple_of},
      {"head_dim", c.explicit_head_dim}, {"sliding_window", c.sliding_window}};
  for (const auto& [key, v] : widths)
    check(v <= kMaxWidth, "model.{}: {} is too large (at most 2^40 = {})", key, v, kMaxWidth);
  check(c.num_layers <= kMaxLayers, "model.num_layers: {} is too large (at most {})", c.num_layers,
        kMaxLayers);
  const double raw_ffn = double(c.hidden_size) * c.mlp_ratio;
  check(std::isfinite(raw_ffn) && raw_ffn <= double(kMaxWidth),
        "model.mlp_ratio: {} gives an FFN width of {:g} from hidden_size {} (at most 2^40)",
        c.mlp_ratio, raw_ffn, c.hidden_size);
  const double V = double(c.vocab_size), H = double(c.hidden_size), F = double(c.ffn_size());
  const double per_layer = double(c.qkv_size()) * H + double(c.attention_size()) * H +
                           3 * F * H + 2 * F + 5 * H + 2 * double(c.head_dim());
  const double params = 2 * V * H + double(c.num_layers) * per_layer + H;
  check(params <= kMaxParams, "model.hidden_size: the model would have {:.3g} parameters (at most "
        "2^50): check model.vocab_size, hidden_size, num_layers and mlp_ratio", params);
}

ParamTable::ParamTable(const ModelConfig& config) : config_(config) {
  check_config(config);
  const int64_t V = config.vocab_size, H = config.hidden_size, F = config.ffn_size();
  const int64_t Q = config.qkv_size();
  tok_embeddings = add("model.tok_embeddings.weight", {V, H}, -1, 0.02, false, false, true);
  for (int i = 0; i < static_cast<int>(config.num_layers); ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    const double out_std = 0.02 / std::sqrt(2.0 * (i + 1));  // InternEvo: per-layer depth
    BlockParamIds b;
    b.attention_norm = add(p + "attention_norm.weight", {H}, i, 0.0, true, false, false);
    b.wqkv = add(p + "attention.wqkv.weight", {Q, H}, i, 0.02, false, false, false);
    if (config.qkv_bias) b.wqkv_bias = add(p + "attention.wqkv.bias", {Q}, i, 0.0, false, true, false);
    b.wo = add(p + "attention.wo.weight", {H, config.attention_size()}, i, out_std, false, false, false);
    if (config.o_bias) b.wo_bias = add(p + "attention.wo.bias", {H}, i, 0.0, false, true, false);
    if (has_qk_norm(config.type)) {
      const int64_t d = config.head_dim();
      b.q_norm = add(p + "attention.q_norm.weight", {d}, i, 0.0, true, false, false);
      b.k_norm = add(p + "attention.k_norm.weight", {d}, i, 0.0, true, false, false);
    }
    b.ffn_norm = add(p + "ffn_norm.weight", {H}, i, 0.0, true, false, false);
    b.w1 = add(p + "feed_forward.w1.weight", {F, H}, i, 0.02, false, false, false);
    if (config.mlp_bias) b.w1_bias = add(p + "feed_forward.w1.bias", {F}, i, 0.0, false, true, false);
    b.w3 = add(p + "feed_forward.w3.weight", {F, H}, i, 0.02, false, false, false);
    if (config.mlp_bias) b.w3_bias = add(p + "feed_forward.w3.bias", {F}, i, 0.0, false, true, false);
    b.w2 = add(p + "feed_forward.w2.weight", {H, F}, i, out_std, false, false, false);
    if (config.mlp_bias) b.w2_bias = add(p + "feed_forward.w2.bias", {H}, i, 0.0, false, true, false);
    layers.push_back(b);
  }
  norm = add("model.norm.weight", {H}, -1, 0.0, true, false, false);
  // Tied: the head op reads and writes the embedding's parameter and gradient (both ops add into
  // the gradient), so saving, the gradient norm and AdamW see the tensor once.
  output = config.tie_word_embeddings ? tok_embeddings
                                      : add("output.weight", {V, H}, -1, 0.02, false, false, false);
}

int ParamTable::add(std::string name, std::vector<int64_t> shape, int layer, double init_std,
                     bool is_norm, bool is_bias, bool is_embedding) {
  ParamView v;
  v.name = std::move(name);
  v.numel = 1;
  for (int64_t s : shape) v.numel *= s;
  v.shape = std::move(shape);
  v.offset = numel_;
  v.layer = layer;
  v.is_matrix = v.shape.size() == 2;
  v.is_norm = is_norm;
  v.is_bias = is_bias;
  v.is_embedding = is_embedding;
  v.init_std = init_std;
  numel_ += v.numel;
  views_.push_back(std::move(v));
  return static_cast<int>(views_.size()) - 1;
}

int ParamTable::find(std::string_view name) const {
  for (size_t i = 0; i < views_.size(); ++i)
    if (views_[i].name == name) return static_cast<int>(i);
  return -1;
}

const ParamView& ParamTable::at(std::string_view name) const {
  const int i = find(name);
  check(i >= 0, "unknown parameter '{}' for this model shape", name);
  return views_[static_cast<size_t>(i)];
}

int64_t ParamTable::matmul_numel() const {
  int64_t n = 0;
  for (const auto& v : views_)
    if (v.is_matrix && !v.is_embedding) n += v.numel;
  if (config_.tie_word_embeddings) n += views_.at(static_cast<size_t>(output)).numel;  // the head
  return n;
}

ParamTable ParamTable::with_shapes(const std::vector<std::vector<int64_t>>& shapes) const {
  check(shapes.size() == views_.size(), "with_shapes: {} shapes for {} tensors", shapes.size(),
        views_.size());
  ParamTable out = *this;
  out.numel_ = 0;
  for (size_t i = 0; i < views_.size(); ++i) {
    ParamView& v = out.views_[i];
    v.shape = shapes[i];
    v.numel = 1;
    for (int64_t s : v.shape) v.numel *= s;
    v.offset = out.numel_;
    out.numel_ += v.numel;
  }
  return out;
}

ParamTable ParamTable::with_views(std::vector<ParamView> views) const {
  ParamTable out = *this;
  out.views_ = std::move(views);
  out.layers.clear();
  out.tok_embeddings = out.norm = out.output = -1;
  out.numel_ = 0;
  for (ParamView& v : out.views_) {
    v.numel = 1;
    for (int64_t s : v.shape) v.numel *= s;
    v.offset = out.numel_;
    out.numel_ += v.numel;
  }
  return out;
}

template <typename T>
Params<T>::Params(const ParamTable& layout)
    : layout_(&layout), data_(static_cast<size_t>(layout.numel())) {}

template <typename T>
void Params<T>::zero() {
  std::fill(data_.begin(), data_.end(), T(0));
}

template <typename T>
void init_tensor(T* p, const ParamView& v, int index, uint64_t seed) {
  if (v.is_norm) { std::fill(p, p + v.numel, T(1)); return; }
  if (v.is_bias || v.init_std == 0.0) { std::fill(p, p + v.numel, T(0)); return; }
  std::mt19937_64 rng(splitmix64(seed + (static_cast<uint64_t>(index) + 1) * 0x9E3779B97F4A7C15ull));
  const auto uniform = [&rng] { return static_cast<double>(rng() >> 11) * 0x1.0p-53; };
  for (int64_t i = 0; i < v.numel; i += 2) {
    const double u1 = uniform(), u2 = uniform();
    const double r = std::sqrt(-2.0 * std::log(1.0 - u1));
    const double a = 2.0 * std::numbers::pi * u2;
    p[i] = static_cast<T>(v.init_std * r * std::cos(a));
    if (i + 1 < v.numel) p[i + 1] = static_cast<T>(v.init_std * r * std::sin(a));
  }
}

template <typename T>
void init_params(Params<T>& params, uint64_t seed) {
  const auto& views = params.layout().views();
  for (size_t k = 0; k < views.size(); ++k)
    init_tensor(params.data() + views[k].offset, views[k], static_cast<int>(k), seed);
}

template class Params<float>;
template class Params<double>;
template void init_params<float>(Params<float>&, uint64_t);
template void init_params<double>(Params<double>&, uint64_t);
template void init_tensor<float>(float*, const ParamView&, int, uint64_t);
template void init_tensor<double>(double*, const ParamView&, int, uint64_t);

}  // namespace longtron::model
