// Checkpoints (docs/training.md): checkpoint_dir/step_N/{model.safetensors, optimizer.safetensors,
// config.json, state.json} and checkpoint_dir/latest naming the newest step folder. The step folder
// is written under a temporary name and renamed, then `latest` is replaced atomically, so a crash
// never leaves a half checkpoint nor a `latest` pointing at one. Works on (name, shape, pointer)
// lists, independent of the model's parameter struct; rank 0 writes full tensors.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "model/model_config.h"
#include "model/params.h"

namespace longtron::parallel {
class ShardPlan;
}

namespace longtron::train {

/// A read-only tensor view: HF name (docs/model.md), shape, `numel` floats at data.
struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;
  /// Elements: the product of shape.
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return n;
  }
};

/// A writable tensor view for loading.
struct MutableTensor {
  std::string name;
  std::vector<int64_t> shape;
  float* data = nullptr;
};

/// state.json: step, the config (to_json(TrainConfig)), sampler position and RNG state as the
/// trainer defines them (opaque JSON here), plus anything extra (e.g. the layout it was saved from).
struct CheckpointState {
  int64_t step = 0;
  nlohmann::json config = nlohmann::json::object();
  nlohmann::json sampler = nlohmann::json::object();
  nlohmann::json rng = nlohmann::json::object();
  nlohmann::json extra = nlohmann::json::object();
};

/// Tensor names in optimizer.safetensors: "<kAdamM><param>", "<kAdamV><param>" (PyTorch AdamW's
/// state names), and the I64 scalar kAdamStep (number of updates taken).
inline constexpr const char* kAdamM = "exp_avg.";
inline constexpr const char* kAdamV = "exp_avg_sq.";
inline constexpr const char* kAdamStep = "step";

/// What one checkpoint holds. adam_m/adam_v list the same names and shapes as params (may be empty
/// lists to save weights only, e.g. export; then no optimizer.safetensors is written).
struct CheckpointData {
  std::vector<NamedTensor> params;
  std::vector<NamedTensor> adam_m;
  std::vector<NamedTensor> adam_v;
  int64_t adam_step = 0;
  model::ModelConfig model;
  int64_t max_position_embeddings = 0;  ///< written to config.json when > 0 (e.g. seq_len)
  CheckpointState state;
  bool progress = false;  ///< progress lines on stderr while the tensors are written
  /// Writes more files into the step folder while it is still the temporary one (e.g. a LoRA
  /// adapter, train/lora_train.h). Empty: nothing more.
  std::function<void(const std::filesystem::path& dir)> write_extra;
  /// false: `params` are not written as model.safetensors (a LoRA step folder holds the adapter
  /// through write_extra instead; the base is not re-saved). They still give the optimizer
  /// tensors' names and shapes; their data is then not read.
  bool write_model = true;
};

/// Writes root/step_<state.step>/ atomically (replacing an existing one), then root/latest
/// ("step_N\n"). Creates root; first removes stale temporaries (remove_stale_temporaries). Returns the step folder. Throws Error naming the file on any
/// failure, leaving neither the step folder nor a changed `latest`.
std::filesystem::path save_checkpoint(const std::filesystem::path& root, const CheckpointData& data);

/// Removes root's temporary folders and files of an interrupted save (`step_N.tmp.PID`,
/// `latest.tmp.PID`, left by a `kill -9` during write_atomically) whose process PID no longer
/// exists on this machine; those of a live process are kept. Returns the removed paths. A missing
/// root is not an error.
std::vector<std::filesystem::path> remove_stale_temporaries(const std::filesystem::path& root);

/// Removes root's checkpoints (step_N folders and `latest`) for `train --overwrite`; other files,
/// and the temporaries of a save in progress, are kept. A missing root is not an error.
void remove_checkpoints(const std::filesystem::path& root);

/// `path` is a step folder (holds state.json) → itself; a root (holds `latest`) → root/<latest>.
/// Throws Error naming the path when neither, or when latest names a missing folder.
std::filesystem::path resolve_checkpoint(const std::filesystem::path& path);

/// state.json of a step folder. Throws Error naming the file when missing or malformed.
CheckpointState read_checkpoint_state(const std::filesystem::path& step_dir);

/// Fills each tensor from step_dir/model.safetensors (or any safetensors path/folder accepted by
/// safetensors::Reader — an HF export works too). Throws Error naming file, tensor and shapes when a
/// tensor is missing or its shape differs. Extra tensors in the file are an error too (they would
/// mean a different model), naming the first one.
void load_model(const std::filesystem::path& step_dir, const std::vector<MutableTensor>& params);

/// The tensors of a full-model buffer under the names of family `format` (empty = the model's
/// type; model/hf_names.h), each name prefixed by `prefix`. A tensor that is one run of rows of
/// a view points straight into `full` (which must outlive it); one made of several runs (Llama's
/// q/k/v are rows of the engine's wqkv) is copied into `storage`.
struct HfTensors {
  std::vector<std::vector<float>> storage;
  std::vector<NamedTensor> tensors;
};
HfTensors hf_named_tensors(const model::Params<float>& full, const std::string& prefix = "",
                           const std::string& format = "");

/// Fills a full-model buffer from `path` (a step folder, an HF folder or a .safetensors file) by
/// the names of the model's family. Throws Error naming the path and tensor when a tensor is
/// missing or mis-shaped, and naming the first tensor of the file that the model does not have.
/// With `progress`, a progress line on stderr for kProgressMinBytes or more (core/progress.h).
void load_hf_model(const std::filesystem::path& path, model::Params<float>& full,
                   bool progress = false);

/// As load_hf_model (same checks), into this rank's shards `local` (over plan.local_layout())
/// instead of a full buffer: each tensor's block is decoded once from the memory-mapped file
/// straight into its place (bf16/f16 converted on the way), and under a sharded layout a rank
/// reads only its own rows and columns. No full-model buffer is allocated. With `progress`, a
/// progress line on stderr when the rank reads kProgressMinBytes or more (core/progress.h; pass
/// it on rank 0 only). Returns the bytes decoded.
uint64_t load_hf_shards(const std::filesystem::path& path, const parallel::ShardPlan& plan,
                        model::Params<float>& local, bool progress = false);

/// As load_hf_optimizer, into this rank's shards (over plan.local_layout()), as load_hf_shards.
int64_t load_hf_optimizer_shards(const std::filesystem::path& step_dir,
                                 const parallel::ShardPlan& plan, model::Params<float>& exp_avg,
                                 model::Params<float>& exp_avg_sq, bool progress = false);

/// AdamW moments of step_dir/optimizer.safetensors by the family's names; returns the stored
/// step count.
int64_t load_hf_optimizer(const std::filesystem::path& step_dir, model::Params<float>& exp_avg,
                          model::Params<float>& exp_avg_sq);

/// The files of a Hugging Face folder that belong to its tokenizer and generation settings
/// (tokenizer.model, tokenizer.json, tokenizer_config.json, special_tokens_map.json,
/// generation_config.json): copied beside the weights into checkpoints and exports.
inline constexpr const char* kTokenizerFiles[] = {
    "tokenizer.model", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "generation_config.json"};

/// Copies those of kTokenizerFiles that exist in `from` into `to` (atomically each, replacing);
/// returns the names copied.
std::vector<std::string> copy_tokenizer_files(const std::filesystem::path& from,
                                              const std::filesystem::path& to);

/// Fills AdamW moments from step_dir/optimizer.safetensors; returns the stored step count.
int64_t load_optimizer(const std::filesystem::path& step_dir, const std::vector<MutableTensor>& adam_m,
                       const std::vector<MutableTensor>& adam_v);

}  // namespace longtron::train
