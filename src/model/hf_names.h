// The tensor names of each naming a family uses (Family::names, model/families.h; docs/model.md):
// which tensors a folder of that family holds and where their rows live in the engine's parameters. The engine keeps InternLM2's fused
// layout (wqkv grouped per kv head, docs/model.md) for every family; Llama, Qwen2 and Mistral's
// separate q/k/v projections are gathered from / scattered into it here.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/params.h"

namespace longtron::model {

/// One tensor of a Hugging Face folder: its name and shape, and the rows of engine view `view`
/// that it is made of, as (first row, row count) blocks concatenated in order. A row is the last
/// dimension of the view (one element for a 1-D tensor).
struct HfTensor {
  std::string name;
  std::vector<int64_t> shape;
  int view = -1;
  std::vector<std::pair<int64_t, int64_t>> rows;
};

/// The tensors of `layout` as family `format` names them (empty = layout.config().type; its
/// Family::names), in Hugging Face's state-dict order. kFused (InternLM2): the engine's names, one
/// tensor per view. kSeparate (Llama, Qwen2, Mistral; transformers' modeling_llama/qwen2/mistral): model.embed_tokens.weight;
/// per layer model.layers.{i}.input_layernorm.weight, self_attn.{q,k,v}_proj.{weight,bias}
/// (q: for every kv group g the rows of its Hq/Hkv query heads; k, v: row block g of each group),
/// self_attn.o_proj.{weight,bias}, post_attention_layernorm.weight, mlp.gate_proj (w1),
/// mlp.up_proj (w3), mlp.down_proj (w2); model.norm.weight, lm_head.weight. Throws Error for an
/// unknown family.
std::vector<HfTensor> hf_tensors(const ParamTable& layout, const std::string& format = "");

/// Copies tensor `t` out of the flat buffer `flat` (laid out by `layout`) into `out` (numel of
/// t.shape values).
template <typename T>
void gather_hf(const HfTensor& t, const ParamTable& layout, const T* flat, T* out);

/// Where tensor `t` lies in `flat` as it is (one run of rows of its view): a pointer to its
/// values, which gather_hf would copy; nullptr when it is made of several runs (Llama's q/k/v).
template <typename T>
const T* hf_in_place(const HfTensor& t, const ParamTable& layout, const T* flat);

/// The inverse of gather_hf: writes `in` into the rows of `flat` that tensor `t` covers.
template <typename T>
void scatter_hf(const HfTensor& t, const ParamTable& layout, const T* in, T* flat);

}  // namespace longtron::model
