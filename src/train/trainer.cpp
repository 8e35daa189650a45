#include "train/trainer.h"

#include <fmt/core.h>

#include <chrono>
#include <cmath>
#include <optional>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "core/threads.h"
#include "data/open.h"
#include "model/hf_config.h"
#include "train/checkpoint.h"
#include "train/evaluate.h"
#include "train/flops.h"
#include "train/metrics.h"
#include "train/optimizer.h"
#include "train/schedule.h"

namespace fs = std::filesystem;

namespace longtron::train {

data::DataConfig loader_config(const TrainConfig& config) {
  data::DataConfig d;
  d.pack.seq_len = config.data.seq_len;
  d.pack.micro_bsz = config.data.micro_bsz;
  d.pack.use_packed_dataset = config.data.use_packed_dataset;
  d.pack.pack_sample_into_one = config.data.pack_sample_into_one;
  d.pack.pack_tail = data::parse_pack_tail(config.data.pack_tail);
  d.micro_num = config.data.micro_num;
  d.shuffle = config.data.shuffle;
  d.seed = static_cast<uint32_t>(config.data.seed);
  d.min_length = config.data.min_length;
  return d;
}

void resolve_model_config(TrainConfig& config, const TrainOptions& options) {
  check(options.resume.empty() || options.init_from.empty(),
        "--resume and --init-from cannot be used together (a resumed run loads its checkpoint)");
  fs::path source;
  if (!options.init_from.empty()) source = options.init_from;
  if (!options.resume.empty()) source = resolve_checkpoint(options.resume);
  if (!source.empty()) {
    const model::ModelConfig from_file = model::read_hf_config(source);
    config.model = model::merge_model_config(from_file, config.model, config.model_keys_given,
                                             (source / "config.json").string());
  }
  check_config(config);
}

double combine_step_loss(const std::vector<model::LossSum>& micro, const std::string& reduction) {
  double sum = 0;
  int64_t count = 0;
  for (const auto& m : micro) {
    if (reduction == "micro_mean") {
      if (m.count > 0) sum += m.sum / static_cast<double>(m.count);
    } else {
      sum += m.sum;
      count += m.count;
    }
  }
  if (reduction == "micro_mean") return micro.empty() ? 0.0 : sum / static_cast<double>(micro.size());
  return count > 0 ? sum / static_cast<double>(count) : 0.0;
}

double micro_loss_scale(const std::string& reduction, int64_t count, int64_t step_count,
                        int64_t micro_num, int64_t dp_size) {
  if (reduction == "micro_mean") {
    const double d = static_cast<double>(micro_num) * static_cast<double>(dp_size) *
                     static_cast<double>(count);
    return d > 0 ? 1.0 / d : 0.0;
  }
  return step_count > 0 ? 1.0 / static_cast<double>(step_count) : 0.0;
}

fs::path find_tokenizer(const fs::path& data_folder) {
  if (data_folder.empty()) return {};
  for (const fs::path& p : {data_folder / "tokenizer.model", data_folder.parent_path() / "tokenizer.model"})
    if (fs::is_regular_file(p)) return p;
  return {};
}

namespace {

/// Valid labels of a micro-batch (the denominator of its loss).
int64_t count_labels(const data::MicroBatch& b) {
  int64_t n = 0;
  for (int32_t l : b.labels) n += l != data::kIgnoreIndex;
  return n;
}

/// Non-pad tokens of a row: the trailing pad run (ids 0, labels -100) is left out (SPEC §1.3).
int64_t count_tokens(const data::MicroBatch& b) {
  auto n = static_cast<int64_t>(b.input_ids.size());
  while (n > 0 && b.input_ids[static_cast<size_t>(n - 1)] == 0 &&
         b.labels[static_cast<size_t>(n - 1)] == data::kIgnoreIndex)
    --n;
  return n;
}

void copy_file_atomically(const fs::path& from, const fs::path& to) {
  const fs::path tmp = to.string() + ".tmp";
  fs::copy_file(from, tmp, fs::copy_options::overwrite_existing);
  fs::rename(tmp, to);
}

/// Everything one run holds.
struct Run {
  const TrainConfig& config;
  const TrainOptions& options;
  comm::CommPtr dp;     // data-parallel group (the world: no model parallelism yet)
  comm::CommPtr zero1;  // optimizer sharding group (nullptr = off)
  bool rank0;
  model::ParamLayout layout;
  model::Params<float> params, grads;
  model::InternLM2<float> model;
  AdamW optimizer;
  LrSchedule schedule;
  data::BatchLoader loader;
  data::Dataset valid_dataset;
  std::unique_ptr<data::DatasetRows> valid_rows;
  std::unique_ptr<MetricsWriter> metrics;
  fs::path tokenizer;
  double sgemm_flops = 0;

  Run(const TrainConfig& c, const TrainOptions& o, comm::CommPtr world, comm::CommPtr z)
      : config(c), options(o), dp(std::move(world)), zero1(std::move(z)), rank0(dp->rank() == 0),
        layout(c.model), params(layout), grads(layout), model(layout, params),
        optimizer(layout, c.optimizer, zero1),
        loader(data::open_dataset(c.data.train_folder), loader_config(c), dp->size()) {
    schedule.lr = c.optimizer.lr;
    schedule.min_lr = c.lr_scheduler.min_lr;
    schedule.warmup_steps = c.lr_scheduler.warmup_steps;
    schedule.total_steps = c.train.total_steps;
    if (!c.data.valid_folder.empty()) {
      valid_dataset = data::open_dataset(c.data.valid_folder);
      valid_rows = std::make_unique<data::DatasetRows>(valid_dataset, loader_config(c).pack,
                                                       c.data.min_length, /*shuffle=*/false,
                                                       static_cast<uint32_t>(c.data.seed));
    }
    tokenizer = find_tokenizer(c.data.train_folder);
  }

  double validate() {
    const model::LossSum ls = evaluate_rows(model, *valid_rows, dp.get());
    return ls.count > 0 ? ls.sum / static_cast<double>(ls.count) : 0.0;
  }

  fs::path save(int64_t step) {
    optimizer.gather_state();
    if (!rank0 || config.train.checkpoint_dir.empty()) return {};
    CheckpointData d;
    d.params = named_tensors(params);
    d.adam_m = optimizer.named_exp_avg();
    d.adam_v = optimizer.named_exp_avg_sq();
    d.adam_step = optimizer.step();
    d.model = config.model;
    d.max_position_embeddings = config.data.seq_len;
    d.state.step = step;
    d.state.config = to_json(config);
    d.state.sampler = loader.sampler().state_at(step);
    d.state.rng = {{"init_seed", config.train.seed}, {"data_seed", config.data.seed}};
    d.state.extra = {{"dp_size", dp->size()}};
    const fs::path dir = save_checkpoint(config.train.checkpoint_dir, d);
    // The tokenizer travels with the checkpoint so generate/export need nothing else.
    if (!tokenizer.empty()) copy_file_atomically(tokenizer, dir / "tokenizer.model");
    return dir;
  }

  void dump_grads(const fs::path& dir) {
    if (!rank0) return;
    fs::create_directories(dir);
    std::vector<safetensors::WriteTensor> tensors;
    for (const auto& t : named_tensors(grads))
      tensors.push_back({t.name, t.shape, safetensors::DType::F32, t.data, nullptr});
    safetensors::write_file(dir / "model.safetensors", tensors, {{"content", "gradients of the step loss, before clipping"}});
  }

  /// One optimizer step (1-based `step`). Returns its metrics row.
  TrainRow step(int64_t step, bool dump) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<data::MicroBatch> batches = loader.step(dp->rank(), step - 1);
    const std::string& reduction = config.train.loss_reduction;
    // Count the step's labels BEFORE the forward so loss_scale makes gradients of the mean.
    int64_t counts[2] = {0, 0};  // valid labels, non-pad tokens
    double sum_l2 = 0;
    for (const auto& b : batches) {
      counts[0] += count_labels(b);
      counts[1] += count_tokens(b);
      sum_l2 += model::sum_squared_segments(b.cu_seqlens);
    }
    if (dp->size() > 1) {
      dp->all_reduce(counts, 2);
      dp->all_reduce(&sum_l2, 1);
    }
    grads.zero();
    double loss_parts[2] = {0, 0};  // token: (Σ sum, –); micro_mean: (Σ micro means, –)
    for (const auto& b : batches) {
      const double scale = micro_loss_scale(reduction, count_labels(b), counts[0],
                                            config.data.micro_num, dp->size());
      const model::LossSum ls = model.forward_backward(b, grads, scale);
      if (reduction == "micro_mean")
        loss_parts[0] += ls.count > 0 ? ls.sum / static_cast<double>(ls.count) : 0.0;
      else
        loss_parts[0] += ls.sum;
    }
    if (dp->size() > 1) {
      dp->all_reduce(grads.data(), grads.numel());
      dp->all_reduce(loss_parts, 1);
    }
    const double loss =
        reduction == "micro_mean"
            ? loss_parts[0] / static_cast<double>(config.data.micro_num * dp->size())
            : (counts[0] > 0 ? loss_parts[0] / static_cast<double>(counts[0]) : 0.0);
    if (dump) dump_grads(options.dump_grads);
    const ClipResult clip =
        clip_grad_norm(squared_norm(grads.data(), static_cast<size_t>(grads.numel())),
                       config.optimizer.clip_grad_norm);
    const double lr = schedule.at(step);
    if (clip.finite) {
      scale_grads(grads.data(), static_cast<size_t>(grads.numel()), clip.scale);
      optimizer.update(params, grads, lr);
    } else if (rank0) {
      fmt::print(stderr, "step {}: non-finite gradient norm, update skipped\n", step);
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const int64_t processed = static_cast<int64_t>(batches.size()) *
                              loader.rows().packed_length() * dp->size();
    TrainRow row;
    row.step = step;
    row.loss = loss;
    row.grad_norm = clip.grad_norm;
    row.lr = lr;
    row.tokens = counts[1];
    row.step_time_s = seconds;
    row.tgs = static_cast<double>(counts[1]) / static_cast<double>(dp->size()) / seconds;
    // Model FLOPs of every position the ranks computed (pad included: it is computed) over the
    // sgemm speed of all ranks together.
    row.mfu = model::model_flops(config.model, processed, sum_l2) / seconds /
              (sgemm_flops * static_cast<double>(dp->size()));
    return row;
  }
};

comm::CommPtr make_zero1_group(const TrainConfig& config, const comm::CommPtr& dp) {
  int64_t z = config.parallel.zero1.size;
  if (z == -1) z = dp->size();
  check(z >= 1 && dp->size() % z == 0,
        "parallel.zero1.size = {} must divide the data-parallel size {} (or be -1)", z, dp->size());
  if (z == 1) return nullptr;
  if (z == dp->size()) return dp;
  return dp->split(dp->rank() / static_cast<int>(z), dp->rank());
}

}  // namespace

TrainSummary run_training(const TrainConfig& config, const TrainOptions& options,
                          comm::CommPtr world) {
  check(config.parallel.tensor.size == 1 && config.parallel.weight.size == 1 &&
            config.parallel.tensor_2d.x * config.parallel.tensor_2d.y == 1,
        "parallel.tensor/weight/tensor_2d: the trainer runs data parallel only so far (sizes must be 1)");
  set_num_threads(static_cast<int>(config.train.num_threads));
  Run run(config, options, world, make_zero1_group(config, world));
  run.sgemm_flops = measure_sgemm_flops(options.sgemm_size);

  TrainSummary summary;
  summary.sgemm_flops = run.sgemm_flops;
  int64_t start = 0;
  if (!options.resume.empty()) {
    const fs::path dir = resolve_checkpoint(options.resume);
    const CheckpointState state = read_checkpoint_state(dir);
    load_model(dir, mutable_tensors(run.params));
    run.optimizer.set_step(load_optimizer(dir, run.optimizer.mutable_exp_avg(),
                                          run.optimizer.mutable_exp_avg_sq()));
    start = state.step;
    check(start <= config.train.total_steps, "--resume {}: checkpoint step {} is past train.total_steps = {}",
          options.resume.string(), start, config.train.total_steps);
  } else if (!options.init_from.empty()) {
    load_model(options.init_from, mutable_tensors(run.params));
  } else {
    model::init_params(run.params, static_cast<uint64_t>(config.train.seed));
  }
  summary.start_step = start;
  if (run.rank0) {
    MetricsOptions mo;
    mo.total_steps = config.train.total_steps;
    mo.log_every = config.train.log_every;
    mo.console = options.console;
    mo.progress = options.progress;
    mo.resume_step = options.resume.empty() ? -1 : start;
    run.metrics = std::make_unique<MetricsWriter>(config.train.metrics_file, mo);
    fmt::print(stderr,
               "train: {} parameters, {} rows/epoch ({} steps), dp {}, {} threads, sgemm {:.1f} GFLOP/s\n",
               run.layout.numel(), run.loader.num_rows(), run.loader.steps_per_epoch(), world->size(),
               num_threads(), run.sgemm_flops * 1e-9);
  }
  auto valid = [&](int64_t step) {
    if (!run.valid_rows) return;
    const double v = run.validate();
    summary.valid.emplace_back(step, v);
    if (run.metrics) run.metrics->valid({step, v});
  };
  const auto t0 = std::chrono::steady_clock::now();
  if (start == 0) valid(0);
  const int64_t total = config.train.total_steps;
  for (int64_t step = start + 1; step <= total; ++step) {
    const TrainRow row = run.step(step, step == start + 1 && !options.dump_grads.empty());
    summary.losses.push_back(row.loss);
    summary.grad_norms.push_back(row.grad_norm);
    summary.rows.push_back(row);
    summary.end_step = step;
    if (run.metrics) run.metrics->train(row);
    const int64_t ve = config.train.valid_every, se = config.train.save_every;
    if (step == total || (ve > 0 && step % ve == 0)) valid(step);
    if (step == total || (se > 0 && step % se == 0)) {
      const fs::path dir = run.save(step);
      if (!dir.empty()) summary.last_checkpoint = dir;
    }
  }
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (run.metrics) run.metrics->finish();
  return summary;
}

}  // namespace longtron::train
