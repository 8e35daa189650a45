// `longtron train`: the main job (docs/training.md). Single process by default; under mpirun the ranks
// form the process grid of the config's parallel.* layout (docs/parallel.md).
#include <fmt/core.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/registry.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "core/json_read.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/memory_plan.h"
#include "train/trainer.h"

namespace longtron::cli {
namespace {

struct TrainCliOptions {
  std::string config = "configs/demo.toml";
  std::vector<std::string> overrides;
  std::string resume, init_from, dump_grads, init_adapter;
  bool overwrite = false;
  bool dry_run = false;
  int ranks = -1;  // -1: --ranks not given
};

/// The end-of-run lines (rank 0): this run's first and last train and valid losses, mean speed
/// (Σ tokens / Σ step time, and per rank) and MFU (step-time weighted), where the outputs went.
void print_summary(const train::TrainSummary& s, int world_size) {
  if (s.rows.empty()) {
    fmt::print("train: nothing to do: step {} is train.total_steps\n", s.start_step);
    return;
  }
  std::string valid;
  if (s.valid.size() == 1)
    valid = fmt::format("; valid_loss {:.4f} (step {})", s.valid.back().second, s.valid.back().first);
  else if (s.valid.size() > 1)
    valid = fmt::format("; valid_loss {:.4f} (step {}) -> {:.4f} (step {})", s.valid.front().second,
                        s.valid.front().first, s.valid.back().second, s.valid.back().first);
  fmt::print("train: steps {}..{} in {:.1f} s, {}; loss {:.4f} (step {}) -> {:.4f} (step {}){}\n",
             s.start_step + 1, s.end_step, s.seconds, s.dtype, s.rows.front().loss, s.rows.front().step,
             s.rows.back().loss, s.rows.back().step, valid);
  double tokens = 0, seconds = 0, mfu_seconds = 0;
  for (const auto& r : s.rows) {
    tokens += static_cast<double>(r.tokens);
    seconds += r.step_time_s;
    mfu_seconds += r.mfu * r.step_time_s;
  }
  const double rate = seconds > 0 ? tokens / seconds : 0;
  fmt::print("train: mean {:.0f} tokens/s ({:.0f} per rank), MFU {:.3f} (against the measured {} GEMM "
             "speed){}\n", rate, rate / world_size, seconds > 0 ? mfu_seconds / seconds : 0.0,
             s.dtype == "bfloat16" ? "bf16" : "fp32",
             s.last_checkpoint.empty() ? "" : "; checkpoint " + s.last_checkpoint.string());
  if (!s.metrics_file.empty())
    fmt::print("train: metrics {}, loss picture {}\n", s.metrics_file.string(), s.plot_file.string());
}

/// Fails before any output is written when `folder` (data.train_folder / data.valid_folder, named
/// by `key`) was prepared with a larger vocabulary than model.vocab_size: `longtron prepare` writes
/// dataset.json (with vocab_size) next to train/ and valid/. Reads only that small file, so it is
/// cheap on any corpus; a dataset without one is checked token by token by the model.
void check_dataset_vocab(const std::string& folder, const char* key, int64_t vocab_size) {
  namespace fs = std::filesystem;
  if (folder.empty()) return;
  const fs::path dir = fs::is_directory(folder) ? fs::path(folder) : fs::path(folder).parent_path();
  for (const fs::path& meta : {dir / "dataset.json", dir.parent_path() / "dataset.json"}) {
    std::ifstream in(meta, std::ios::binary);
    if (!in) continue;
    const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    const nlohmann::json j = try_parse_json(text).value_or(nlohmann::json());
    if (!j.is_object() || !j.contains("vocab_size") || !j["vocab_size"].is_number_integer()) return;
    const int64_t data_vocab = j["vocab_size"].get<int64_t>();
    check(data_vocab <= vocab_size,
          "{} = {}: tokenized with vocab_size {} ({}), but model.vocab_size is {} (set "
          "model.vocab_size >= {})", key, folder, data_vocab, meta.string(), vocab_size, data_vocab);
    return;
  }
}

int run_train(const TrainCliOptions& o) {
  return comm::run_on_world([&](const comm::CommPtr& world) {
    train::TrainOptions options;
    options.resume = o.resume;
    options.init_from = o.init_from;
    // A checkpoint root (config.json in its step folders, `latest` naming one) means its latest
    // step, as for --resume, eval and export.
    namespace fs = std::filesystem;
    if (!o.init_from.empty() && fs::is_directory(o.init_from) &&
        !fs::exists(fs::path(o.init_from) / "config.json") &&
        fs::exists(fs::path(o.init_from) / "latest"))
      options.init_from = train::resolve_checkpoint(o.init_from).string();
    options.dump_grads = o.dump_grads;
    options.init_adapter = o.init_adapter;
    options.overwrite = o.overwrite;
    options.dry_run = o.dry_run;
    options.dry_run_ranks = std::max(o.ranks, 0);  // 0: the ranks it runs on
    check(o.ranks == -1 || o.dry_run, "--ranks {} is only for --dry-run (under mpirun the ranks are -np)", o.ranks);
    check(o.ranks == -1 || o.ranks >= 1, "--ranks must be >= 1, got {}", o.ranks);
    train::ConfigNeeds needs;
    needs.model_shape = o.resume.empty() && o.init_from.empty();
    train::TrainConfig config = train::load_config(o.config, o.overrides, needs);
    train::resolve_model_config(config, options);
    check_dataset_vocab(config.data.train_folder, "data.train_folder", config.model.vocab_size);
    check_dataset_vocab(config.data.valid_folder, "data.valid_folder", config.model.vocab_size);
    const train::TrainSummary s = train::run_training(config, options, world);
    if (o.dry_run) {
      if (world->rank() == 0) fmt::print("{}", s.plan_text);
      return 0;
    }
    if (world->rank() == 0) {
      print_summary(s, world->size());
      fmt::print("train: peak memory {} on rank 0, {}\n", train::format_bytes(s.measured_peak_bytes),
                 train::compare_to_plan(s.measured_peak_bytes, s.planned_peak_bytes));
    }
    return 0;
  });
}

Subcommand train_command(help_order::kTrain, [](CLI::App& app) {
  auto o = std::make_shared<TrainCliOptions>();
  auto* sub = app.add_subcommand("train", "Train a model on packed rows (docs/training.md)");
  sub->add_option("--config", o->config, "TOML config (default configs/demo.toml)");
  sub->add_option("--set", o->overrides, "Override: section.key=value (repeatable)")
      ->expected(1)->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  sub->add_option("--resume", o->resume, "Continue from a checkpoint root (latest) or step folder");
  sub->add_option("--init-from", o->init_from, "Start from a Hugging Face folder (or a checkpoint: step folder, or root meaning its latest step)");
  sub->add_option("--init-adapter", o->init_adapter,
                  "LoRA: start the adapters from a PEFT folder (adapter_config.json must agree "
                  "with [lora])");
  sub->add_flag("--overwrite", o->overwrite,
                "Replace the checkpoints of an earlier run in train.checkpoint_dir (a fresh run "
                "into a non-empty folder is refused otherwise)");
  sub->add_flag("--dry-run", o->dry_run,
               "Print the plan (layout, FLOPs per step, memory per rank broken down) and exit");
  sub->add_option("--ranks", o->ranks,
                  "With --dry-run: plan for this many ranks (default: the ranks it runs on, or the "
                  "fewest the layout needs)");
  sub->add_option("--dump-grads", o->dump_grads,
                  "Write the first step's gradients (before clipping) as safetensors to DIR");
  return [o] { return run_train(*o); };
});

}  // namespace
}  // namespace longtron::cli
