// The training job's configuration (docs/configuration.md): a TOML file plus `--set section.key=value`
// overrides. Key names mirror InternEvo's config.py where it has one.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "model/model_config.h"
#include "packing/balance.h"
#include "packing/context_split.h"
#include "packing/pack.h"
#include "parallel/layout.h"
#include "parallel/tp2d_overlap.h"
#include "train/loss_reduction.h"
#include "train/preference_config.h"

namespace longtron::train {

/// `data` section (docs/data.md, docs/configuration.md). Paths are absolute after load_config
/// (empty = not given). Names of a set are the data library's enums (parsed once, at load);
/// train::loader_config (trainer.h) turns the section into the loader's data::DataConfig.
struct DataConfig {
  std::string train_folder;
  std::string valid_folder;  ///< empty: no validation
  int64_t seq_len = 0;
  int64_t micro_bsz = 0;
  int64_t micro_num = 1;
  bool use_packed_dataset = true;
  bool pack_sample_into_one = false;
  data::PackTail pack_tail = data::PackTail::kPad;
  bool split_documents = true;    ///< false: a document not fitting a row's rest starts the next
  bool shuffle = true;
  int64_t seed = 1024;
  int64_t min_length = 0;
  data::BalanceMode balance = data::BalanceMode::kNone;  ///< docs/balance.md
  int64_t balance_window = 8;        ///< steps' worth of rows per "documents" window
  std::vector<double> balance_cost;  ///< [per token, per causal pair]; empty: from the model's FLOPs
};

/// `optimizer` section: AdamW (weight decay on matrices only).
struct OptimizerConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.01;
  double clip_grad_norm = 1.0;  ///< <= 0: no clipping
};

/// `lr_scheduler` section. load_config sets min_lr = 0.1 × lr when the key is absent.
struct LrSchedulerConfig {
  int64_t warmup_steps = 0;
  double min_lr = 1e-4;
};

/// parallel.tensor: `tensor = 4` means {size = 4, mode = "mtp"}.
struct TensorParallelConfig {
  int64_t size = 1;
  parallel::TensorMode mode = parallel::TensorMode::kMtp;
};
/// parallel.weight (ISP weight parallel).
struct WeightParallelConfig {
  int64_t size = 1;
  bool overlap = false;
};
/// parallel.zero1: -1 = the whole data-parallel group, 1 = off.
struct Zero1Config {
  int64_t size = -1;
};
/// parallel.tensor_2d (MindSpeed 2D TP). `given` is true when the table appears in the config.
struct Tensor2dConfig {
  int64_t x = 1;
  int64_t y = 1;
  parallel::Overlap2D overlap = parallel::Overlap2D::kNone;
  bool given = false;
};

/// parallel.sequence_2D (InternEvo's 2D-Attention for isp: head parallel × context parallel,
/// docs/isp.md). `given` is true when the table appears in the config.
struct Sequence2DConfig {
  bool enable = false;
  int64_t head_size = 1;
  int64_t context_size = 1;
  int64_t window_size = 1;
  bool head_first = true;    ///< device_placement_strategy.head_first
  bool interleaved = false;  ///< device_placement_strategy.interleaved
  data::ContextBalance balance = data::ContextBalance::kZigzag;
  bool given = false;
};

/// The `parallel` section as written (every key kept, also those a disabled table ignores);
/// layout_of gives the parallel library's Layout that the engine and the memory plan use.
struct ParallelConfig {
  TensorParallelConfig tensor;
  WeightParallelConfig weight;
  Zero1Config zero1;
  Tensor2dConfig tensor_2d;
  Sequence2DConfig sequence_2d;
  bool tensor_given = false;  ///< parallel.tensor appeared in the config
};

/// `train` section (common practice names).
struct TrainSection {
  int64_t total_steps = 0;
  int64_t seed = 0;
  int64_t num_threads = 0;  ///< 0 = auto
  int64_t log_every = 1;
  int64_t valid_every = 0;  ///< 0 = only at step 0 and the end
  int64_t save_every = 0;   ///< 0 = only at the end
  std::string checkpoint_dir;  ///< empty: no checkpoints
  std::string metrics_file;    ///< empty: console only
  LossReduction loss_reduction = LossReduction::kToken;
  /// Consecutive steps whose update was skipped (non-finite loss or gradient norm) that end the
  /// run with an error; the last checkpoint saved before them stays the newest.
  int64_t max_skipped_steps = 5;
};

/// The whole job. `model_keys_given` lists the model.* keys that the TOML or --set spelt out
/// (e.g. "hidden_size"), so --init-from can check them against config.json (hf_config.h).
struct TrainConfig {
  model::ModelConfig model;
  DataConfig data;
  OptimizerConfig optimizer;
  LrSchedulerConfig lr_scheduler;
  ParallelConfig parallel;
  TrainSection train;
  PreferenceConfig preference;  ///< `[preference]`: used when the data holds preference pairs
  std::set<std::string> model_keys_given;
  /// Whether the TOML or --set gave a `[preference]` key (data without pairs then is an error).
  bool preference_given = false;
  std::string source;  ///< the config file path, for messages
  /// Keys given by --set (e.g. "data.seq_len") → the whole argument ("data.seq_len=0"), so that
  /// messages blame the --set rather than the file.
  std::map<std::string, std::string> set_by;
};

/// What load_config insists on. Shape keys may be left out when the model comes from a
/// Hugging Face folder (`--init-from`) or a checkpoint; data keys when no data is read.
struct ConfigNeeds {
  bool model_shape = true;  ///< model.vocab_size, hidden_size, num_layers, num_attention_heads, num_kv_attention_heads
  bool data = true;         ///< data.train_folder, seq_len, micro_bsz
  bool total_steps = true;  ///< train.total_steps
};

/// Reads `path` (TOML), applies `overrides` ("section.key=value" each, later wins), checks and
/// returns the config. `--set` values are read as a TOML value when "k = <value>" parses (numbers,
/// true/false, "quoted strings", inline tables, arrays), else as a bare string; dotted keys reach
/// sub-tables (parallel.tensor.size=2). Relative paths become absolute from the working directory.
/// Throws Error naming the file (with line) or the --set and the full key for: TOML syntax errors,
/// unknown keys or sections ("data.seq_lenn: unknown key"), wrong types, missing required keys,
/// and failed sanity checks (see check_config).
TrainConfig load_config(const std::filesystem::path& path, const std::vector<std::string>& overrides = {},
                        const ConfigNeeds& needs = {});

/// As load_config, from TOML text (`source` names it in messages). For tests and embedded configs.
TrainConfig parse_config(const std::string& toml_text, const std::string& source,
                         const std::vector<std::string>& overrides = {}, const ConfigNeeds& needs = {});

/// Sanity checks, naming the key: seq_len, micro_bsz, micro_num, total_steps > 0 (those needed),
/// model sizes > 0, heads divide hidden, kv heads divide heads, mode/loss_reduction/pack_tail/overlap
/// in their sets, tensor and tensor_2d not both > 1, sizes ≥ 1, lr/min_lr/betas in range. Call it
/// again after filling the model shape from a Hugging Face config.
void check_config(const TrainConfig& config, const ConfigNeeds& needs = {});

/// Sanity checks of a model shape alone (prefix "model." in messages).
void check_model_config(const model::ModelConfig& model);

/// Where `key` came from, for messages: "--set key=value" when a --set gave it (or a parent
/// table), else "FILE: key".
std::string config_origin(const TrainConfig& config, const std::string& key);

/// The config as JSON with the TOML section/key names (for state.json and logs): every key of the
/// table (config_keys.h), parallel.tensor_2d only when given.
nlohmann::json to_json(const TrainConfig& config);

/// A config saved by to_json (a checkpoint's state.json "config"), read back through the same key
/// table. Lenient, as a hand-edited or foreign state file must not stop a command that needs a
/// few of its keys: a key that is absent, or whose value has another type or an unknown name,
/// keeps its default; unknown keys are ignored and nothing is checked.
TrainConfig saved_train_config(const nlohmann::json& saved);

/// The parallel::Layout of the config's parallel.* keys (docs/parallel.md): what the trainer builds
/// its process grid from and what the memory plan sizes each rank's shards by.
parallel::Layout layout_of(const ParallelConfig& p);

}  // namespace longtron::train
