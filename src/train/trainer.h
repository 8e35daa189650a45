// The training job (docs/training.md): micro_num micro-batches per step from the sampler, gradient
// accumulation of the token-weighted step loss, data-parallel gradient all-reduce, global-norm
// clipping, AdamW with warmup + cosine, metrics, validation and checkpoints.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "model/decoder.h"
#include "packing/loader.h"
#include "train/config.h"
#include "train/metrics.h"
#include "train/step.h"  // combine_step_loss, micro_loss_scale

namespace longtron::train {

/// Command-line options of `longtron train` beyond the config (README, "Commands").
struct TrainOptions {
  std::filesystem::path resume;      ///< checkpoint root or step folder; empty = fresh start
  std::filesystem::path init_from;   ///< Hugging Face folder (config.json + safetensors); empty = init
  std::filesystem::path dump_grads;  ///< writes the first step's gradients here; empty = no dump
  /// LoRA: start the adapters from this PEFT folder (its adapter_config.json must agree with
  /// [lora]); empty = A drawn from lora.seed, B zero.
  std::filesystem::path init_adapter;
  bool overwrite = false;            ///< a fresh run may replace the checkpoints in checkpoint_dir
  bool console = true;               ///< metric rows on stdout (rank 0)
  bool progress = true;              ///< live progress line on a terminal (rank 0)
  int64_t sgemm_size = 2048;         ///< n of the start-up sgemm timing (tests use a small one)
  bool dry_run = false;              ///< print the memory plan (rank 0) and return without training
  int dry_run_ranks = 0;             ///< dry run: plan for this many ranks (0: the world, or the
                                     ///< fewest the layout needs when run as one process)
  double memory_available = -1;      ///< bytes per rank; < 0: read from the system (memory_plan.h)
};

/// What a run did (for the CLI summary and tests).
struct TrainSummary {
  int64_t start_step = 0;            ///< step the run started after (0, or the resumed step)
  int64_t end_step = 0;              ///< last step taken
  std::vector<double> losses;        ///< step loss of steps start_step+1 … end_step
  std::vector<double> grad_norms;    ///< before clipping, same steps
  std::vector<TrainRow> rows;        ///< every step's metrics row (step time, tgs, mfu, ...)
  int64_t updates = 0;               ///< steps whose update was applied (not skipped)
  std::vector<std::pair<int64_t, double>> valid;  ///< (step, valid_loss) rows written
  double seconds = 0;                ///< wall time of the loop (validation and saving included)
  double sgemm_flops = 0;            ///< fp32 GEMM FLOP/s measured at start-up (MFU denominator)
  double bf16_gemm_flops = 0;        ///< bf16 × bf16 → fp32 GEMM FLOP/s at start-up (0: unavailable)
  std::string dtype = "float32";     ///< precision of the run's GEMMs (the metrics rows' dtype)
  std::filesystem::path last_checkpoint;  ///< step folder written last (empty if none)
  std::filesystem::path metrics_file;     ///< train.metrics_file (empty: console only)
  std::filesystem::path plot_file;        ///< the loss picture written next to it (empty if none)
  double planned_peak_bytes = 0;     ///< the memory plan's peak per rank (memory_plan.h)
  double measured_peak_bytes = 0;    ///< peak resident size of world rank 0 (VmHWM) at the end
  std::string plan_text;             ///< the memory plan as printed by --dry-run
};

/// The data.* settings of the loader (docs/data.md) from a TrainConfig.
data::DataConfig loader_config(const TrainConfig& config);

/// Fills config.model from the Hugging Face config.json of `options.init_from`, or of the
/// checkpoint of `options.resume`, when one is given: model.* keys spelt out in the TOML must agree
/// (Error naming the key and both values, hf_config.h merge_model_config). Then re-checks the config.
void resolve_model_config(TrainConfig& config, const TrainOptions& options);

/// Runs the job on `world` (a one-rank local communicator, or the MPI world split into the process
/// grid of parallel.* — dp × tensor/weight/2D — with the model in a parallel::ParallelEngine and
/// ZeRO-1 over parallel.zero1). Layout errors are raised first, before data or parameters. Sets
/// threads to train.num_threads (0: cores ÷ ranks on the node), measures sgemm FLOP/s, builds or
/// loads the model (options; checkpoints hold full HF-named tensors whatever the layout), trains
/// steps start+1 … total_steps. World rank 0 writes metrics and checkpoints. Throws Error for bad
/// data, configs, layouts or checkpoints (naming them), for a non-empty train.checkpoint_dir on a
/// fresh run without options.overwrite, for a failed metrics write, and after
/// train.max_skipped_steps updates in a row were skipped (non-finite loss, gradient norm or
/// update), and at the end when no step applied an update or the last step was skipped (a skipped
/// step writes no checkpoint).
/// Before any allocation the memory plan (memory_plan.h) is made and a run that cannot fit is
/// refused with it (Error); with options.dry_run only the plan is made (summary.plan_text).
TrainSummary run_training(const TrainConfig& config, const TrainOptions& options, comm::CommPtr world);

/// Finds the tokenizer file of a data folder (text::find_tokenizer_file: tokenizer.json with its
/// tokenizer_config.json, or tokenizer.model): in it, or in its parent (prepare writes them into
/// DIR next to DIR/train and DIR/valid). Empty path when absent.
std::filesystem::path find_tokenizer(const std::filesystem::path& data_folder);

}  // namespace longtron::train
