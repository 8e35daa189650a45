// A trained model read back from a checkpoint or a Hugging Face folder (eval, export, generate).
// Its weights reach the model only through a ParallelEngine (load_into_engine), as in training.
#pragma once
#include <nlohmann/json.hpp>

#include <filesystem>
#include <memory>

#include "model/params.h"
#include "modes/engine.h"
#include "ops/precision.h"
#include "parallel/layout.h"

namespace longtron::train {

/// Weights, shape and the run's settings of one checkpoint step (or HF folder).
struct LoadedModel {
  std::filesystem::path dir;      ///< the step folder (or the HF folder)
  nlohmann::json train_config;    ///< state.json "config" (empty object for an HF folder)
  std::filesystem::path tokenizer;  ///< tokenizer.model or tokenizer.json found for it (empty when none)
  std::unique_ptr<model::ParamTable> layout;
  std::unique_ptr<model::Params<float>> params;  ///< full HF tensors (released by load_into_engine)
  /// The weights are not read yet (load_model_dir with read_weights = false): load_into_engine
  /// reads them from `dir` straight into the engine's shards.
  bool weights_pending = false;
  /// A LoRA step folder (train/peft.h, docs/lora.md): the base folder its state.json names. The
  /// weights (`params`) are then the base's with the step's adapter merged in fp32 (W + s·B·A).
  std::filesystem::path lora_base;
};

/// Loads `path`: a checkpoint root (its latest step), a step folder, or a Hugging Face folder
/// (config.json + safetensors, f32/bf16/f16, single or sharded) of any family of
/// a family of model/families.h, by that family's tensor names (model/hf_names.h). The tokenizer is looked up in the
/// folder, its parent, then next to the run's data.train_folder. Throws Error naming the path when
/// nothing loadable is there or a tensor is missing or mis-shaped. With `read_weights` false only
/// the shape, settings and tokenizer are read (weights_pending; params stays null) and the tensors
/// are checked when load_into_engine reads them. Loading shows a progress line on stderr. A LoRA
/// step folder (adapter_config.json and state.json's extra.lora instead of model.safetensors) is
/// read as its base (checked: lora_checkpoint_base) with the adapter merged, always in full.
LoadedModel load_model_dir(const std::filesystem::path& path, bool read_weights = true);

/// The compute type eval and generate run in: `dtype` (their --dtype) when not empty, else the
/// run's model.dtype from state.json ("float32" for an HF folder or a run from before the key),
/// resolved on this CPU by ops::resolve_dtype (`note` receives its note). Throws Error naming
/// --dtype or the state.json key for an unknown name or a bfloat16 this CPU cannot run.
ops::ComputeType loaded_compute_type(const LoadedModel& m, const std::string& dtype,
                                     std::string* note = nullptr);

/// The loaded weights in a ParallelEngine over `grid` (one rank: the dense mode): every rank keeps
/// its shards of m.params, which is then released; or, when m.weights_pending, reads its shards
/// straight from m.dir (train::load_hf_shards: no full copy; progress on world rank 0).
/// packed_length as ParallelEngine's (0: no row length check). Layout errors are raised before
/// the engine allocates. Collective over the grid.
std::unique_ptr<parallel::ParallelEngine> load_into_engine(LoadedModel& m, const parallel::Grid& grid,
                                                           int64_t packed_length = 0);

}  // namespace longtron::train
