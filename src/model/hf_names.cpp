#include "model/hf_names.h"

#include <algorithm>

#include "core/error.h"
#include "model/families.h"

namespace longtron::model {
namespace {

int64_t row_size(const ParamView& v) { return v.shape.size() == 2 ? v.shape[1] : 1; }

/// The whole view under another name.
HfTensor whole(const ParamTable& layout, int view, std::string name) {
  const ParamView& v = layout.view(view);
  return {std::move(name), v.shape, view, {{0, v.shape[0]}}};
}

/// q (part 0), k (1) or v (2) of the grouped wqkv rows [Hkv, Hq/Hkv + 2, d] (docs/model.md).
HfTensor qkv_part(const ParamTable& layout, int view, int part, std::string name) {
  const ModelConfig& c = layout.config();
  const int64_t d = c.head_dim(), groups = c.num_kv_attention_heads;
  const int64_t per = c.num_attention_heads / groups;  // query heads per kv group
  const int64_t first = part == 0 ? 0 : (per + part - 1) * d;
  const int64_t count = part == 0 ? per * d : d;
  HfTensor t{std::move(name), layout.view(view).shape, view, {}};
  for (int64_t g = 0; g < groups; ++g) t.rows.emplace_back(g * (per + 2) * d + first, count);
  t.shape[0] = groups * count;
  return t;
}

/// The tensors under Llama's names (TensorNames::kSeparate).
std::vector<HfTensor> separate_tensors(const ParamTable& layout) {
  std::vector<HfTensor> out;
  out.push_back(whole(layout, layout.tok_embeddings, "model.embed_tokens.weight"));
  for (size_t i = 0; i < layout.layers.size(); ++i) {
    const BlockParamIds& b = layout.layers[i];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    const char* parts[] = {"q_proj", "k_proj", "v_proj"};
    for (int k = 0; k < 3; ++k) {
      out.push_back(qkv_part(layout, b.wqkv, k, p + "self_attn." + parts[k] + ".weight"));
      if (b.wqkv_bias >= 0)
        out.push_back(qkv_part(layout, b.wqkv_bias, k, p + "self_attn." + parts[k] + ".bias"));
    }
    out.push_back(whole(layout, b.wo, p + "self_attn.o_proj.weight"));
    if (b.wo_bias >= 0) out.push_back(whole(layout, b.wo_bias, p + "self_attn.o_proj.bias"));
    if (b.q_norm >= 0) {  // Qwen3Attention's q_norm, k_norm
      out.push_back(whole(layout, b.q_norm, p + "self_attn.q_norm.weight"));
      out.push_back(whole(layout, b.k_norm, p + "self_attn.k_norm.weight"));
    }
    out.push_back(whole(layout, b.w1, p + "mlp.gate_proj.weight"));
    out.push_back(whole(layout, b.w3, p + "mlp.up_proj.weight"));
    out.push_back(whole(layout, b.w2, p + "mlp.down_proj.weight"));
    if (b.w1_bias >= 0) {  // Llama's mlp_bias
      out.push_back(whole(layout, b.w1_bias, p + "mlp.gate_proj.bias"));
      out.push_back(whole(layout, b.w3_bias, p + "mlp.up_proj.bias"));
      out.push_back(whole(layout, b.w2_bias, p + "mlp.down_proj.bias"));
    }
    out.push_back(whole(layout, b.attention_norm, p + "input_layernorm.weight"));
    out.push_back(whole(layout, b.ffn_norm, p + "post_attention_layernorm.weight"));
  }
  out.push_back(whole(layout, layout.norm, "model.norm.weight"));
  if (layout.output != layout.tok_embeddings)  // tied: no lm_head.weight in the files
    out.push_back(whole(layout, layout.output, "lm_head.weight"));
  return out;
}

}  // namespace

std::vector<HfTensor> hf_tensors(const ParamTable& layout, const std::string& format) {
  const std::string type = format.empty() ? layout.config().type : format;
  const Family& f = family(type, "model format");
  check(f.block.qk_norm == has_qk_norm(layout.config().type),
        "cannot name the tensors of a {} model as {}: {} q_norm and k_norm, this model {}",
        layout.config().type, type, f.block.qk_norm ? "it has" : "it has no",
        f.block.qk_norm ? "has none" : "has them");
  if (f.names == TensorNames::kSeparate) return separate_tensors(layout);
  std::vector<HfTensor> out;
  for (int i = 0; i < static_cast<int>(layout.views().size()); ++i)
    out.push_back(whole(layout, i, layout.view(i).name));
  return out;
}

template <typename T>
void gather_hf(const HfTensor& t, const ParamTable& layout, const T* flat, T* out) {
  const ParamView& v = layout.view(t.view);
  const int64_t r = row_size(v);
  for (const auto& [first, count] : t.rows) {
    const T* src = flat + v.offset + first * r;
    out = std::copy(src, src + count * r, out);
  }
}

template <typename T>
const T* hf_in_place(const HfTensor& t, const ParamTable& layout, const T* flat) {
  if (t.rows.size() != 1) return nullptr;
  const ParamView& v = layout.view(t.view);
  return flat + v.offset + t.rows.front().first * row_size(v);
}

template <typename T>
void scatter_hf(const HfTensor& t, const ParamTable& layout, const T* in, T* flat) {
  const ParamView& v = layout.view(t.view);
  const int64_t r = row_size(v);
  for (const auto& [first, count] : t.rows) {
    std::copy(in, in + count * r, flat + v.offset + first * r);
    in += count * r;
  }
}

template void gather_hf<float>(const HfTensor&, const ParamTable&, const float*, float*);
template void gather_hf<double>(const HfTensor&, const ParamTable&, const double*, double*);
template const float* hf_in_place<float>(const HfTensor&, const ParamTable&, const float*);
template void scatter_hf<float>(const HfTensor&, const ParamTable&, const float*, float*);
template void scatter_hf<double>(const HfTensor&, const ParamTable&, const double*, double*);

}  // namespace longtron::model
