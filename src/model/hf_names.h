// One name table per Hugging Face family (docs/model.md): which tensors a folder of that family
// holds and where their rows live in the engine's parameters. The engine keeps InternLM2's fused
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

/// The tensors of `layout` as family `format` names them (empty = layout.config().type), in
/// Hugging Face's state-dict order. InternLM2: the engine's names, one tensor per view. Llama,
/// Qwen2, Mistral (transformers' modeling_llama/qwen2/mistral): model.embed_tokens.weight;
/// per layer model.layers.{i}.input_layernorm.weight, self_attn.{q,k,v}_proj.{weight,bias}
/// (q: for every kv group g the rows of its Hq/Hkv query heads; k, v: row block g of each group),
/// self_attn.o_proj.{weight,bias}, post_attention_layernorm.weight, mlp.gate_proj (w1),
/// mlp.up_proj (w3), mlp.down_proj (w2); model.norm.weight, lm_head.weight. Throws Error for an
/// unknown family.
std::vector<HfTensor> hf_tensors(const ParamTable& layout, const std::string& format = "");

/// One linear layer of a block (a LoRA target, docs/lora.md) as family `format` names it: the
/// module path ("model.layers.3.self_attn.q_proj", the weight's name without ".weight"), the
/// target name ("q_proj", the last component), the layer, and its weight (shape [out, in]; the
/// rows of the engine view it is made of, as hf_tensors gives them).
struct HfLinear {
  std::string module;
  std::string target;
  int layer = -1;
  HfTensor weight;
};

/// The linear layers of every block of `layout` under family `format`'s names (empty =
/// layout.config().type), in hf_tensors' order: Llama, Qwen2, Mistral q_proj, k_proj, v_proj (rows
/// of the engine's wqkv), o_proj, gate_proj, up_proj, down_proj; InternLM2 wqkv, wo, w1, w3, w2.
/// Not the embedding nor the head (PEFT's "all-linear" leaves the head out too).
std::vector<HfLinear> hf_linears(const ParamTable& layout, const std::string& format = "");

/// The target names of hf_linears for family `type`, in that order. Throws Error for an unknown
/// family.
std::vector<std::string> hf_linear_targets(const std::string& type);

/// Copies tensor `t` out of the flat buffer `flat` (laid out by `layout`) into `out` (numel of
/// t.shape values).
template <typename T>
void gather_hf(const HfTensor& t, const ParamTable& layout, const T* flat, T* out);

/// The inverse of gather_hf: writes `in` into the rows of `flat` that tensor `t` covers.
template <typename T>
void scatter_hf(const HfTensor& t, const ParamTable& layout, const T* in, T* flat);

}  // namespace longtron::model
