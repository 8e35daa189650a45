// LoRA adapters as Hugging Face PEFT folders (docs/lora.md): adapter_model.safetensors with PEFT's
// tensor names and adapter_config.json with PEFT's LoraConfig fields, as peft's
// `PeftModel.save_pretrained` writes them and `PeftModel.from_pretrained` reads them
// (https://github.com/huggingface/peft, src/peft/utils/save_and_load.py and tuners/lora/config.py).
// Also: the fingerprint of a base model's weights, the conversion between InternLM2's fused wqkv
// adapter and Llama's q/k/v adapters, and merging an adapter into a full model (W + s·B·A).
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "model/model_config.h"
#include "model/params.h"

namespace longtron::train {

/// LoRA settings as PEFT's adapter_config.json holds them.
struct PeftLoraConfig {
  int r = 0;
  double lora_alpha = 0.0;
  double lora_dropout = 0.0;
  std::vector<std::string> target_modules;  ///< as PEFT writes them: family module names, e.g. "q_proj"
  bool use_rslora = false;
  std::string base_model_name_or_path;
  /// adapter_config.json gave target_modules as one string: PEFT's regular expression matched
  /// against the full module name (target_modules then holds that one string).
  bool target_is_regex = false;
};

/// The scale s of y = W x + s · B A x: lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora
/// (Kalajdzievski 2023, "A Rank Stabilization Scaling Factor for Fine-Tuning with LoRA"; PEFT's
/// LoraLayer.update_layer). Throws Error when r <= 0.
double lora_scale(const PeftLoraConfig& config);

/// One adapted module. `module` is the PEFT module path WITHOUT the "base_model.model." prefix and
/// without ".lora_A.weight", in the FAMILY's Hugging Face naming, e.g. "model.layers.0.self_attn.q_proj"
/// (Llama/Qwen2/Mistral) or "model.layers.0.attention.wqkv" (InternLM2). A [r, in], B [out, r], row-major fp32.
struct PeftModuleAdapter {
  std::string module;
  int64_t in = 0, out = 0;
  std::vector<float> A, B;
};

struct PeftAdapter {
  PeftLoraConfig config;
  std::vector<PeftModuleAdapter> modules;  ///< in checkpoint order (layer, then module)
};

/// PEFT's tensor name prefix: a causal LM's PeftModel wraps the model as `base_model.model`.
inline constexpr const char* kPeftPrefix = "base_model.model.";
/// The file names of a PEFT folder.
inline constexpr const char* kAdapterWeightsFile = "adapter_model.safetensors";
inline constexpr const char* kAdapterConfigFile = "adapter_config.json";

/// Writes adapter_model.safetensors (names base_model.model.<module>.lora_A.weight / .lora_B.weight,
/// F32) and adapter_config.json (peft_type "LORA", task_type "CAUSAL_LM", r, lora_alpha, lora_dropout,
/// target_modules, use_rslora, base_model_name_or_path, bias "none", ...) into `dir` (created), each file
/// atomically. Throws longtron::Error on a non-finite value, naming the tensor, and on modules whose
/// A/B sizes disagree with r, in and out.
void write_peft_adapter(const std::string& dir, const PeftAdapter& adapter);

/// Reads a PEFT folder (either dtype F32/BF16/F16 in the safetensors). Throws longtron::Error naming the
/// file and tensor on: missing files, A/B pairs incomplete, shapes not [r,in]/[out,r], r disagreeing with
/// adapter_config.json, NaN/Inf values, peft_type not LORA. Modules come in the file's order of
/// (layer, then position of the module in the block); tensors other than lora_A/lora_B weights
/// (e.g. lora_magnitude_vector of DoRA, bias) are refused naming the tensor.
PeftAdapter read_peft_adapter(const std::string& dir);

/// A fingerprint of a Hugging Face folder's weights (all *.safetensors / *.bin tensors' bytes, hashed),
/// so a checkpoint can tell whether its base changed (optimizer.safetensors, adapter_model.safetensors
/// and training_args.bin are not weights). Stable across runs, thread counts and (little-endian)
/// machines: a 64-bit multiply-rotate hash of each fixed 64 MiB chunk (4 lanes of 8-byte words;
/// chunks hashed in parallel), combined in order with each file's name and size, files in name
/// order; one pass over the memory-mapped bytes. Not cryptographic: it detects a changed or
/// different base, not a forgery. Returns "lt64:<16 hex digits>". Throws Error naming the folder
/// when it holds no weight file, and the file when one cannot be read.
std::string base_fingerprint(const std::string& hf_dir);

/// The base folder of a LoRA step folder (docs/lora.md): state.json's extra.lora.base, checked to
/// exist and to hold the weights the adapter was trained on (its base_fingerprint equals
/// extra.lora.base_fingerprint). Returns an empty path for a step folder without extra.lora (a
/// full checkpoint) or a folder without state.json. Throws Error naming the step folder and the
/// base path when the base was moved, deleted or changed.
std::filesystem::path lora_checkpoint_base(const std::filesystem::path& step_dir);

// The adaptable linears of a model and their names (one mapping for training and files) are
// model::lora_modules and model::lora_family_targets (model/lora.h), built on model/hf_names.h.

/// Checks `adapter` against the model of `layout` (naming `where`, e.g. the folder, in every
/// message): each module must be an adaptable linear of the model in the layout's family naming
/// and in the config's target_modules, with in/out equal to its weight's [out, in], r > 0, A and
/// B of r·in and out·r finite values. Throws Error naming the tensor otherwise.
void check_adapter_fits(const PeftAdapter& adapter, const model::ParamTable& layout,
                        const std::string& where);

/// W += s·B·A (lora_scale) for every module of `adapter`, in fp32 with a double accumulator per
/// element, into the full buffer `full` (whose family naming the adapter uses). Checks the
/// adapter first (check_adapter_fits). PEFT's `merge_and_unload`.
void merge_peft_adapter(const PeftAdapter& adapter, model::Params<float>& full,
                        const std::string& where);

/// InternLM2's adapter of wqkv (B's rows in wqkv's grouped row layout [Hkv, Hq/Hkv + 2, d],
/// docs/model.md) as Llama q_proj, k_proj, v_proj adapters that share A and take their rows of B
/// (exact: B_q A, B_k A, B_v A are the q, k and v rows of B A), and wo, w1, w3, w2 as o_proj,
/// gate_proj, up_proj, down_proj. target_modules follow. `config` is the model's shape (for the
/// head grouping). Throws Error when the adapter is not InternLM2's.
PeftAdapter internlm2_adapter_as_llama(const PeftAdapter& adapter, const model::ModelConfig& config);

/// The inverse: Llama's q/k/v adapters of each layer as one wqkv adapter with B's rows placed in
/// the grouped layout (and o/gate/up/down_proj as wo/w1/w3/w2). Exact when q, k and v of a layer
/// share A (as internlm2_adapter_as_llama writes them). Otherwise, with `allow_rank_growth`, the
/// A's are stacked (rank 3r, B block-diagonal and scaled by s/s' so that s'·B'·A' is s·B·A of each
/// part: exact up to the rounding of that scaling); without it an Error naming the modules explains
/// why. A layer adapting only
/// some of q/k/v gets zero rows of B for the others.
PeftAdapter llama_adapter_as_internlm2(const PeftAdapter& adapter, const model::ModelConfig& config,
                                       bool allow_rank_growth = false);

}  // namespace longtron::train
