#include "train/trainer.h"

#include <fmt/core.h>

#include <chrono>
#include <functional>
#include <cmath>
#include <numeric>
#include <optional>
#include <utility>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/phase.h"
#include "core/plural.h"
#include "core/safetensors.h"
#include "data/open.h"
#include "data/validate.h"
#include "model/hf_config.h"
#include "modes/engine.h"
#include "ops/cpu_features.h"
#include "ops/ops.h"
#include "ops/precision.h"
#include "ops/threads.h"
#include "packing/context_split.h"
#include "text/tokenizer.h"
#include "train/checkpoint.h"
#include "train/data_progress.h"
#include "train/evaluate.h"
#include "train/flops.h"
#include "train/lora_train.h"
#include "train/memory_plan.h"
#include "train/metrics.h"
#include "train/preference.h"
#include "train/optimizer.h"
#include "train/schedule.h"
#include "train/step.h"

namespace fs = std::filesystem;

namespace longtron::train {


data::DataConfig loader_config(const TrainConfig& config) {
  data::DataConfig d;
  d.pack.seq_len = config.data.seq_len;
  d.pack.micro_bsz = config.data.micro_bsz;
  d.pack.use_packed_dataset = config.data.use_packed_dataset;
  d.pack.pack_sample_into_one = config.data.pack_sample_into_one;
  d.pack.pack_tail = config.data.pack_tail;
  d.pack.split_documents = config.data.split_documents;
  d.micro_num = config.data.micro_num;
  d.shuffle = config.data.shuffle;
  d.seed = static_cast<uint32_t>(config.data.seed);
  d.min_length = config.data.min_length;
  d.pack.pair_max_length = config.preference.max_length;
  d.pack.pair_keep_end = config.preference.truncation_keep_end;
  d.balance.mode = config.data.balance;
  d.balance.window = config.data.balance_window;
  d.balance.cost = model::balance_cost(config.model);  // a given [a, b] keeps the model's window
  if (config.data.balance_cost.size() == 2) {
    d.balance.cost.per_token = config.data.balance_cost[0];
    d.balance.cost.per_pair = config.data.balance_cost[1];
  }
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
    const model::LoraConfig lora = config.model.lora;  // [lora] is not config.json's
    config.model = model::merge_model_config(from_file, config.model, config.model_keys_given,
                                             (source / "config.json").string());
    config.model.lora = lora;
  }
  check(!config.model.lora.enabled() || !source.empty(),
        "{}: [lora] trains adapters on a frozen base: give the base with --init-from HF_DIR (or "
        "--resume a LoRA checkpoint); adapters on a randomly drawn base are meaningless",
        config_origin(config, "lora.rank"));
  check_config(config);
}

fs::path find_tokenizer(const fs::path& data_folder) {
  if (data_folder.empty()) return {};
  for (const fs::path& folder : {data_folder, data_folder.parent_path()})
    if (const fs::path p = text::find_tokenizer_file(folder); !p.empty()) return p;
  return {};
}

namespace {

/// Opens the dataset of config key `key` and checks every token id against the model's vocabulary
/// before any work, so a mismatched dataset (even one without dataset.json) fails up front with
/// its file, document and position rather than mid-run. One read pass over the tokens, with
/// progress lines when `show` (rank 0) and the dataset is large (DataProgress).
data::Dataset open_checked(const fs::path& folder, const char* key, int64_t vocab_size, bool show) {
  data::Dataset dataset = data::open_dataset(folder);
  DataProgress progress(fmt::format("{} = {}", key, folder.string()), show);
  try {
    data::validate_dataset(dataset, vocab_size, &progress);
  } catch (const Error& e) {
    fail("{} = {}: {} (model.vocab_size = {})", key, folder.string(), e.what(), vocab_size);
  }
  return dataset;
}

/// Creates `dir` (named by `what`, e.g. a config key) or fails with a user error naming it.
void ensure_directory(const fs::path& dir, const std::string& what) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  check(!ec, "{} = {}: cannot create the folder ({})", what, dir.string(), ec.message());
}


void copy_file_atomically(const fs::path& from, const fs::path& to) {
  const fs::path tmp = to.string() + ".tmp";
  fs::copy_file(from, tmp, fs::copy_options::overwrite_existing);
  fs::rename(tmp, to);
}

/// Everything one run holds. The model lives in a ParallelEngine (modes/engine.h): this rank's
/// shards of the parameters and gradients, the layout's ops and reductions; params/grads/model
/// are references into it. Checkpoints hold full HF-named tensors whatever the layout.
struct Run {
  const TrainConfig& config;
  const TrainOptions& options;
  parallel::Grid grid;
  comm::CommPtr dp;  // data-parallel group: ranks that read different rows
  bool rank0;        // world rank 0 writes metrics and checkpoints
  parallel::ParallelEngine engine;
  const model::Params<float>& params;  // for reading: writes go through engine.params()
  model::Params<float>& grads;
  model::Decoder<float>& model;
  AdamW optimizer;
  LrSchedule schedule;
  data::BatchLoader loader;
  data::Dataset valid_dataset;
  std::unique_ptr<data::DatasetRows> valid_rows;
  std::unique_ptr<MetricsWriter> metrics;
  /// Preference training (the data holds pairs): the loss, and the reference model of the
  /// losses that compare with one (the starting weights, frozen; setup_preference).
  std::optional<PreferenceStep> preference;
  std::unique_ptr<parallel::ParallelEngine> reference;
  fs::path tokenizer;
  double sgemm_flops = 0;
  ops::ComputeType compute = ops::ComputeType::kFloat32;  // model.dtype on this CPU
  double gemm_flops = 0;  // GEMM FLOP/s of `compute` (the MFU denominator)
  int gemm_retimes_left = 3;  // re-timings of gemm_flops allowed (step_mfu)

  Run(const TrainConfig& c, const TrainOptions& o, parallel::Grid g)
      : config(c), options(o), grid(std::move(g)), dp(grid.data), rank0(grid.world_rank == 0),
        // A run that loads its weights (--init-from, --resume) draws none: they are read
        // straight into this rank's shards (load_full).
        engine(o.init_from.empty() && o.resume.empty()
                   ? parallel::ParallelEngine(c.model, grid, static_cast<uint64_t>(c.train.seed),
                                              loader_config(c).pack.packed_length())
                   : parallel::ParallelEngine(c.model, grid, loader_config(c).pack.packed_length(),
                                              parallel::ParallelEngine::Unfilled{})),
        params(std::as_const(engine).params()), grads(engine.grads()), model(engine.model()),
        optimizer(engine.train_layout(), c.optimizer, grid.zero1),
        loader(open_checked(c.data.train_folder, "data.train_folder", c.model.vocab_size, rank0),
               loader_config(c), dp->size(),
               std::make_unique<DataProgress>("data.train_folder = " + c.data.train_folder,
                                              rank0).get()) {
    schedule.lr = c.optimizer.lr;
    schedule.min_lr = c.lr_scheduler.min_lr;
    schedule.warmup_steps = c.lr_scheduler.warmup_steps;
    schedule.total_steps = c.train.total_steps;
    if (!c.data.valid_folder.empty()) {
      valid_dataset =
          open_checked(c.data.valid_folder, "data.valid_folder", c.model.vocab_size, rank0);
      DataProgress progress("data.valid_folder = " + c.data.valid_folder, rank0);
      valid_rows = std::make_unique<data::DatasetRows>(valid_dataset, loader_config(c).pack,
                                                       c.data.min_length, /*shuffle=*/false,
                                                       static_cast<uint32_t>(c.data.seed), &progress);
    }
    tokenizer = find_tokenizer(c.data.train_folder);
  }

  /// The held-out row of `step` (rank 0 writes it): the loss through the engine (evaluate_rows:
  /// dp rank r scores rows r, r+D, …), or for pairs the preference loss and rewards.
  ValidRow validate_row(int64_t step) {
    if (!preference) return {step, validate()};
    const PreferenceStats s =
        preference_evaluate(engine, reference.get(), preference->config, *valid_rows);
    ValidRow row{step, s.step_loss()};
    row.preference = true;
    row.valid_reward_accuracy = s.pairs > 0 ? s.accuracy / s.pairs : 0.0;
    row.valid_reward_margin = s.pairs > 0 ? s.margin / s.pairs : 0.0;
    return row;
  }

  /// The held-out loss through the engine (evaluate_rows: dp rank r scores rows r, r+D, …).
  double validate() {
    // In the engine's compute context: under bf16 the GEMMs read its bf16 copy of the weights,
    // as in a step (the memory plan counts the copy, not a rounded head weight per call).
    const model::LossSum ls = evaluate_rows(engine, *valid_rows);
    return ls.count > 0 ? ls.sum / static_cast<double>(ls.count) : 0.0;
  }

  /// Full tensors of a local param-shaped buffer (collective: every rank calls it).
  std::unique_ptr<model::Params<float>> full_of(const model::Params<float>& local) {
    auto full = std::make_unique<model::Params<float>>(engine.full_layout());
    engine.gather_full(*full, local);
    return full;
  }

  /// Loads full HF tensors from `dir` into this rank's shards of `local`: each tensor's block is
  /// read once from the mapped file, no full copy (load_hf_shards); progress on rank 0.
  void load_full(const fs::path& dir, model::Params<float>& local) {
    load_hf_shards(dir, engine.plan(), local, rank0);
  }

  /// The base folder of a LoRA run (absolute): --init-from, or the one a resumed checkpoint names.
  fs::path lora_base;
  /// Its base_fingerprint, hashed once when the base is loaded (each save would otherwise read
  /// the whole base again).
  std::string lora_base_fingerprint;

  /// PEFT's adapter_config.json fields of this run.
  PeftLoraConfig peft_config() const {
    return peft_config_of(config.model.lora, config.model.type, lora_base.string());
  }

  /// The LoRA step folder: the adapter as a PEFT folder, its AdamW moments, state.json naming the
  /// base (absolute path and fingerprint) — the base is not re-saved.
  fs::path save_lora(int64_t step) {
    const PeftLoraConfig pc = peft_config();
    const PeftAdapter adapter = gather_peft_adapter(engine, engine.train_params(), pc);
    std::unique_ptr<model::Params<float>> full_p, full_m, full_v;
    {
      // The whole adapters (of the full shapes the writer is given), not this rank's shards.
      full_p = std::make_unique<model::Params<float>>(engine.train_full_layout());
      engine.gather_train_full(*full_p, engine.train_params());
      model::Params<float> m(engine.train_layout()), v(engine.train_layout());
      optimizer.gather_state(m, v);
      full_m = std::make_unique<model::Params<float>>(engine.train_full_layout());
      full_v = std::make_unique<model::Params<float>>(engine.train_full_layout());
      engine.gather_train_full(*full_m, m);
      engine.gather_train_full(*full_v, v);
    }
    if (!rank0) return {};
    CheckpointData d;
    const model::ParamTable& table = engine.train_full_layout();
    for (int i = 0; i < int(table.views().size()); ++i) {
      const model::ParamView& view = table.view(i);
      const std::string name = std::string(kPeftPrefix) + view.name;
      d.params.push_back({name, view.shape, full_p->ptr(i)});  // not written (write_model false)
      d.adam_m.push_back({name, view.shape, full_m->ptr(i)});
      d.adam_v.push_back({name, view.shape, full_v->ptr(i)});
    }
    d.write_model = false;
    d.write_extra = [&](const fs::path& tmp) { write_peft_adapter(tmp.string(), adapter); };
    d.adam_step = optimizer.step();
    d.model = config.model;
    d.max_position_embeddings = config.data.seq_len;
    d.state.step = step;
    d.progress = true;
    d.state.config = to_json(config);
    d.state.sampler = loader.sampler().state_at(step);
    d.state.rng = {{"init_seed", config.train.seed}, {"data_seed", config.data.seed}};
    d.state.extra = {{"dp_size", dp->size()}, {"tensor_size", grid.tp}, {"mode", engine.mode()},
                     {"lora", lora_state_json()}};
    const fs::path dir = save_checkpoint(config.train.checkpoint_dir, d);
    if (!tokenizer.empty())
      for (const fs::path& file : text::tokenizer_file_set(tokenizer))
        copy_file_atomically(file, dir / file.filename());
    copy_tokenizer_files(lora_base, dir);
    return dir;
  }

  /// state.json's "lora": the base folder and its fingerprint, and the [lora] settings.
  nlohmann::json lora_state_json() const {
    const model::LoraConfig& l = config.model.lora;
    return {{"base", lora_base.string()},
            {"base_fingerprint", lora_base_fingerprint},
            {"rank", l.rank},
            {"alpha", l.alpha},
            {"dropout", l.dropout},
            {"targets", peft_config().target_modules},
            {"use_rslora", l.use_rslora},
            {"base_dtype", enum_name(model::kLoraBaseDtypeNames, l.base_dtype)},
            {"seed", l.seed}};
  }

  fs::path save(int64_t step) {
    if (config.train.checkpoint_dir.empty()) return {};
    if (engine.has_lora()) return save_lora(step);
    const auto full_params = full_of(params);
    std::unique_ptr<model::Params<float>> full_m, full_v;
    {
      // ZeRO-1 slices → this rank's local moments (zero1 group), then HF tensors (model groups);
      // the local buffers live only for the save.
      model::Params<float> m(engine.local_layout()), v(engine.local_layout());
      optimizer.gather_state(m, v);
      full_m = full_of(m);
      full_v = full_of(v);
    }
    if (!rank0) return {};
    CheckpointData d;
    // Under the family's names (model/hf_names.h): views of the full buffers above, or copies
    // (Llama's q/k/v); all of them live until the save is written.
    const HfTensors hp = hf_named_tensors(*full_params), hm = hf_named_tensors(*full_m),
                    hv = hf_named_tensors(*full_v);
    d.params = hp.tensors;
    d.adam_m = hm.tensors;
    d.adam_v = hv.tensors;
    d.adam_step = optimizer.step();
    d.model = config.model;
    d.max_position_embeddings = config.data.seq_len;
    d.state.step = step;
    d.progress = true;  // rank 0 only writes
    d.state.config = to_json(config);
    d.state.sampler = loader.sampler().state_at(step);
    d.state.rng = {{"init_seed", config.train.seed}, {"data_seed", config.data.seed}};
    d.state.extra = {{"dp_size", dp->size()}, {"tensor_size", grid.tp}, {"mode", engine.mode()}};
    const fs::path dir = save_checkpoint(config.train.checkpoint_dir, d);
    // The tokenizer travels with the checkpoint so generate/export need nothing else.
    if (!tokenizer.empty())
      for (const fs::path& file : text::tokenizer_file_set(tokenizer))
        copy_file_atomically(file, dir / file.filename());
    // So do the tokenizer files of the Hugging Face folder (or checkpoint) the run started from.
    copy_tokenizer_files(options.init_from.empty() ? options.resume : options.init_from, dir);
    return dir;
  }

  void dump_grads(const fs::path& dir) {
    if (engine.has_lora()) {  // the adapter gradients by their PEFT names
      const PeftAdapter g = gather_peft_adapter(engine, engine.train_grads(), peft_config());
      if (!rank0) return;
      ensure_directory(dir, "--dump-grads");
      std::vector<safetensors::WriteTensor> tensors;
      const int64_t r = config.model.lora.rank;
      for (const PeftModuleAdapter& m : g.modules) {
        const std::string p = std::string(kPeftPrefix) + m.module;
        tensors.push_back({p + ".lora_A.weight", {r, m.in}, safetensors::DType::F32, m.A.data(), nullptr});
        tensors.push_back({p + ".lora_B.weight", {m.out, r}, safetensors::DType::F32, m.B.data(), nullptr});
      }
      safetensors::write_file(dir / kAdapterWeightsFile, tensors,
                              {{"content", "LoRA adapter gradients of the step loss, before clipping"}});
      return;
    }
    const auto full = full_of(grads);
    if (!rank0) return;
    ensure_directory(dir, "--dump-grads");
    std::vector<safetensors::WriteTensor> tensors;
    const HfTensors named = hf_named_tensors(*full);  // family names; outlives the write
    for (const auto& t : named.tensors)
      tensors.push_back({t.name, t.shape, safetensors::DType::F32, t.data, nullptr});
    safetensors::write_file(dir / "model.safetensors", tensors, {{"content", "gradients of the step loss, before clipping"}});
  }

  /// 2D-Attention: Σ max ÷ Σ mean of the context ranks' attention work over the step's rows of
  /// every dp rank (context_split.h); 0 when not context parallel.
  double cp_imbalance(const std::vector<data::MicroBatch>& batches) const {
    const parallel::Layout& l = grid.layout;
    if (!l.seq2d || l.seq2d_context <= 1) return 0;
    double parts[2] = {0, 0};
    for (const auto& b : batches) {
      const auto [max, mean] = data::context_work_max_mean(
          b.cu_seqlens, l.seq2d_context, l.tensor_size, l.seq2d_balance);
      parts[0] += max;
      parts[1] += mean;
    }
    if (dp->size() > 1) dp->all_reduce(parts, 2);
    return parts[1] > 0 ? parts[0] / parts[1] : 1.0;
  }

  /// One optimizer step (1-based `step`) through train_step (step.h). Returns its metrics row.
  TrainRow step(int64_t step, bool dump) {
    const auto t0 = std::chrono::steady_clock::now();
    // Every rank plans the whole global batch (no communication): its rows and the imbalance.
    const data::StepPlan plan = loader.plan(step - 1);
    const std::vector<data::MicroBatch> batches = loader.micro_batches(plan, dp->rank());
    StepOptions so;
    so.loss_reduction = config.train.loss_reduction;
    so.micro_num = config.data.micro_num;
    so.lr = schedule.at(step);
    so.clip_grad_norm = config.optimizer.clip_grad_norm;
    if (dump) so.on_gradients = [this](parallel::ParallelEngine&) { dump_grads(options.dump_grads); };
    if (preference) so.preference = &*preference;
    // The GEMMs of forward and backward in the engine's compute context (the run's dtype; the
    // reductions and AdamW have no GEMM). bf16: one bf16 copy of this rank's weights, which the
    // update refreshes in its own pass.
    const uint64_t sent_before = comm::global_stats().total_sent();
    const StepResult r = train_step(engine, optimizer, batches, so);
    const uint64_t sent = comm::global_stats().total_sent() - sent_before;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const int64_t processed = static_cast<int64_t>(batches.size()) *
                              loader.rows().packed_length() * dp->size();
    TrainRow row;
    row.step = step;
    row.loss = r.loss;
    row.grad_norm = r.grad_norm;
    row.lr = so.lr;
    row.tokens = r.tokens;
    row.step_time_s = seconds;
    row.skipped = r.skipped;
    row.update_nonfinite = r.update_nonfinite;
    row.imbalance = plan.imbalance();
    row.dtype = ops::compute_type_name(compute);
    row.tgs = static_cast<double>(r.tokens) / static_cast<double>(grid.world_size) / seconds;
    row.cp_imbalance = cp_imbalance(batches);
    row.sent_mb = double(sent) * 1e-6;
    if (preference) set_preference_metrics(preference->stats, row);
    // Model FLOPs of every position the ranks computed (pad included: it is computed) over the
    // GEMM speed of the step's dtype on all ranks together.
    const double flops = model::model_flops(config.model, processed, r.sum_l2) / seconds /
                         static_cast<double>(grid.world_size);
    // No collective in the re-timing: each rank keeps its own rate.
    row.mfu = step_mfu(flops, gemm_flops, gemm_retimes_left,
                       [&] { return measure_gemm_flops(compute, options.sgemm_size); });
    return row;
  }
};

/// Preference training when the data holds pairs (docs/preference.md): the settings it cannot
/// run with are refused naming the key; the reference of sigmoid/ipo/hinge/robust is a frozen
/// copy of the weights the run starts from (after --init-from), in the run's compute type.
void setup_preference(Run& run, const TrainOptions& options, ops::ComputeType compute) {
  const TrainConfig& c = run.config;
  if (!run.loader.has_pairs()) {
    check(!c.preference_given, "[preference] is set, but data.train_folder = {} holds documents, "
          "not preference pairs (make them with longtron prepare --preference)",
          c.data.train_folder);
    return;
  }
  check(run.engine.model().takes_token_weights(),
        "preference training does not run under layout \"{}\" yet (parallel.tensor.mode = "
        "\"isp\": its head holds a slice of the row, and a pair's log-prob needs the whole "
        "sequence); use mtp, msp, fsp, 2D or data parallel", run.engine.mode());
  check(!c.model.checkpoint, "preference training needs model.checkpoint = false (the head's "
        "two passes read the final hidden states of the whole row)");
  check(!run.valid_rows || run.valid_rows->has_pairs(),
        "data.valid_folder = {} holds documents, data.train_folder pairs: validation of a "
        "preference run needs pairs", c.data.valid_folder);
  const bool reference = uses_reference(c.preference.loss_type);
  check(!reference || options.resume.empty() || run.engine.has_lora(),
        "--resume of a full fine-tuning preference run with loss_type \"{}\" is not supported "
        "yet (its reference is the starting weights, which the checkpoint does not hold; under "
        "[lora] the reference is the base, and resuming works)",
        enum_name(kPreferenceLossNames, c.preference.loss_type));
  check(!reference || !run.engine.has_lora() || options.init_adapter.empty(),
        "--init-adapter with preference.loss_type \"{}\": the reference would be the base plus "
        "that adapter, which is not supported yet (the reference under [lora] is the base alone)",
        enum_name(kPreferenceLossNames, c.preference.loss_type));
  run.preference.emplace();
  run.preference->config = c.preference;
  // Under [lora] the reference is the frozen base: the adapters switched off, no copy.
  if (!reference || run.engine.has_lora()) return;
  model::Params<float> full(run.engine.full_layout());
  run.engine.gather_full(full, run.engine.params());
  run.reference = std::make_unique<parallel::ParallelEngine>(
      c.model, run.grid, full, run.loader.rows().packed_length());
  run.reference->set_compute_type(compute);
  run.preference->reference = run.reference.get();
}

/// Rank 0, before any work: removes leftovers of interrupted saves (checkpoint_dir and the
/// --resume root), and refuses a fresh run into a checkpoint_dir that holds files unless
/// --overwrite (then its checkpoints are removed).
void prepare_checkpoint_dir(const TrainConfig& config, const TrainOptions& options) {
  check(!(options.overwrite && !options.resume.empty()),
        "--overwrite and --resume cannot be used together (--resume continues the checkpoints)");
  std::vector<fs::path> roots = {config.train.checkpoint_dir};
  if (!options.resume.empty()) roots.insert(roots.end(), {options.resume, options.resume.parent_path()});
  for (const fs::path& root : roots)
    if (!root.empty())
      for (const fs::path& p : remove_stale_temporaries(root))
        fmt::print(stderr, "train: removed {} (left by an interrupted save of a process that no "
                   "longer exists)\n", p.string());
  const fs::path dir = config.train.checkpoint_dir;
  std::error_code ec;
  if (dir.empty() || !options.resume.empty() || !fs::is_directory(dir, ec) || fs::is_empty(dir, ec))
    return;
  check(options.overwrite,
        "train.checkpoint_dir = {} is not empty (checkpoints of an earlier run?): pass --resume {} "
        "to continue that run, --overwrite to replace its checkpoints, or set "
        "train.checkpoint_dir to another folder", dir.string(), dir.string());
  remove_checkpoints(dir);
  fmt::print(stderr, "train: --overwrite: removed the checkpoints in {}\n", dir.string());
}

/// A step whose update was skipped: says so (rank 0), and after `max_in_a_row` such steps in a
/// row ends the run (every rank throws, as they all saw the same step).
void report_skip(const TrainRow& row, int64_t in_a_row, int64_t max_in_a_row, bool rank0,
                 const fs::path& last_checkpoint) {
  if (rank0)
    fmt::print(stderr, "step {}: {} (loss {}, grad_norm {}, lr {:.4g}), update skipped ({} in a row; "
               "train.max_skipped_steps = {})\n", row.step,
               row.update_nonfinite       ? "the update would make weights non-finite"
               : std::isfinite(row.loss) ? "non-finite gradient norm"
                                         : "non-finite loss",
               row.loss, row.grad_norm, row.lr, in_a_row, max_in_a_row);
  check(in_a_row < max_in_a_row,
        "step {}: {} steps in a row had a non-finite loss, gradient norm or update (train.max_skipped_steps "
        "= {}); the run stops. Last good checkpoint: {}. Lower optimizer.lr, raise "
        "lr_scheduler.warmup_steps or check the data", row.step, in_a_row, max_in_a_row,
        last_checkpoint.empty() ? std::string("none") : last_checkpoint.string());
}

}  // namespace

namespace {

/// About the launch of the process (static initialisation, before main): start-up times count
/// from here.
const std::chrono::steady_clock::time_point g_process_start = std::chrono::steady_clock::now();

/// The fewest ranks `layout` runs on: the tensor group, and under ISP also the weight group.
int fewest_ranks(const parallel::Layout& l) {
  const int tp = l.tp();
  if (l.tensor_mode != parallel::TensorMode::kIsp) return tp;
  return std::lcm(tp, l.weight_size);
}

/// Runs `body` on rank 0 of `world` only; an Error it throws is thrown on every rank with rank
/// 0's message, so that the job ends as an error every rank sees. Collective over `world`.
void everyone_fails_with_rank0(comm::Communicator& world, const std::function<void()>& body) {
  std::string message;
  bool failed = false;
  if (world.rank() == 0) {
    try {
      body();
    } catch (const Error& e) {
      message = e.what();
      failed = true;
    }
  }
  if (world.size() > 1) {
    int64_t length = failed ? static_cast<int64_t>(message.size()) : -1;
    world.broadcast(&length, 1, 0);
    failed = length >= 0;
    if (failed) {
      std::vector<int32_t> text(message.begin(), message.end());
      text.resize(static_cast<size_t>(length));
      world.broadcast(text.data(), length, 0);
      message.assign(text.begin(), text.end());
    }
  }
  if (failed) throw Error(message);
}

/// Why a dry run plans the dtype it does: "auto"'s resolution on this CPU, or, for an explicit
/// "bfloat16" this CPU could not train, that it plans for another machine.
std::string dtype_plan_note(const std::string& dtype, const std::string& auto_note) {
  if (dtype == "auto") return " (" + auto_note + ")";
  if (dtype != "bfloat16") return "";
  try {
    ops::resolve_dtype(dtype, "model.dtype");
    return "";
  } catch (const Error& e) {
    return fmt::format(" (planned as given; this CPU could not train it: {})", e.what());
  }
}

/// --dry-run: the plan of the layout on the ranks it runs on, or (as one process) on
/// options.dry_run_ranks or the fewest the layout needs; nothing is allocated or written.
TrainSummary dry_run(const TrainConfig& config, const TrainOptions& options, const comm::CommPtr& world) {
  const parallel::Layout layout = layout_of(config.parallel);
  int ranks = options.dry_run_ranks > 0 ? options.dry_run_ranks : world->size();
  if (options.dry_run_ranks <= 0 && ranks == 1) ranks = std::max(1, fewest_ranks(layout));
  MemoryPlanInputs in;
  in.world_size = ranks;
  in.ranks_on_node = world->size() > 1 ? comm::ranks_on_node() : ranks;
  in.runtime_bytes = resident_bytes();
  in.sgemm_size = options.sgemm_size;
  in.resume = !options.resume.empty();
  in.init_from = !options.init_from.empty();
  in.longest_document = longest_document(config.data.train_folder);
  // The dtype the run would compute in: "auto" as this CPU resolves it, an explicit name as given
  // (a dry run may plan a bfloat16 run for another machine).
  const std::string dtype = ops::canonical_dtype(config.model.dtype);
  std::string note;
  in.bf16 = dtype == "bfloat16" ||
            (dtype == "auto" && ops::resolve_dtype(dtype, "model.dtype", &note) == ops::ComputeType::kBFloat16);
  const MemoryPlan plan = plan_memory(config, in);
  TrainSummary summary;
  summary.planned_peak_bytes = plan.peak_bytes;
  summary.plan_text = format_plan(plan) +
                      fmt::format("  dtype: {}{}\n", in.bf16 ? "bfloat16" : "float32",
                                  dtype_plan_note(dtype, note));
  const double available = options.memory_available >= 0 ? options.memory_available
                                                         : available_memory_bytes(in.ranks_on_node);
  if (available > 0)
    summary.plan_text += fmt::format("  available: {} per rank ({} rank{} on this machine)\n",
                                     format_bytes(available), in.ranks_on_node,
                                     in.ranks_on_node == 1 ? "" : "s");
  return summary;
}

}  // namespace

namespace {

/// --resume of a LoRA step folder: the base from the folder state.json names (refused when it
/// moved or its weights changed), the adapter and its AdamW moments from the step folder.
void resume_lora(Run& run, const fs::path& dir, const CheckpointState& state) {
  check(state.extra.is_object() && state.extra.contains("lora"),
        "--resume {}: not a LoRA checkpoint (state.json has no extra.lora), but [lora] is set "
        "(lora.rank = {})", dir.string(), run.config.model.lora.rank);
  const fs::path base = lora_checkpoint_base(dir);  // refused when moved or changed, naming it
  run.lora_base = base;
  run.lora_base_fingerprint = state.extra["lora"]["base_fingerprint"].get<std::string>();  // checked
  run.load_full(base, run.engine.params());
  const PeftAdapter a = read_peft_adapter(dir.string());
  // rank, alpha, use_rslora and targets define the adapter: a change is refused naming both.
  check_adapter_matches(a.config, run.config.model.lora, run.config.model.type, dir.string());
  // Dropout and its seed are training settings (as in PEFT, whose resumed runs take the
  // script's LoraConfig): they may change, and the run says so.
  const nlohmann::json& saved = state.extra["lora"];
  const model::LoraConfig& l = run.config.model.lora;
  if (run.rank0 && saved.contains("dropout") && saved["dropout"].get<double>() != l.dropout)
    fmt::print(stderr, "train: --resume {}: lora.dropout = {} (the checkpoint trained with {})\n",
               dir.string(), l.dropout, saved["dropout"].get<double>());
  if (run.rank0 && saved.contains("seed") && saved["seed"].get<int64_t>() != l.seed)
    fmt::print(stderr, "train: --resume {}: lora.seed = {} (the checkpoint trained with {}): "
               "other dropout masks from here\n", dir.string(), l.seed,
               saved["seed"].get<int64_t>());
  load_peft_adapter(run.engine, a, run.engine.train_params(), dir.string());
  const model::ParamTable& table = run.engine.train_full_layout();
  model::Params<float> m(table), v(table);
  std::vector<MutableTensor> lm, lv;
  for (int i = 0; i < int(table.views().size()); ++i) {
    const std::string name = std::string(kPeftPrefix) + table.view(i).name;
    lm.push_back({name, table.view(i).shape, m.ptr(i)});
    lv.push_back({name, table.view(i).shape, v.ptr(i)});
  }
  run.optimizer.set_step(load_optimizer(dir, lm, lv));
  model::Params<float> local_m(run.engine.train_layout()), local_v(run.engine.train_layout());
  run.engine.scatter_train_full(local_m, m);
  run.engine.scatter_train_full(local_v, v);
  run.optimizer.load_state(local_m, local_v);
}

}  // namespace

TrainSummary run_training(const TrainConfig& config, const TrainOptions& options,
                          comm::CommPtr world) {
  if (options.dry_run) return dry_run(config, options, world);
  // Layout errors (world, heads, P against the layout) come first, before any data or memory.
  parallel::Grid grid = parallel::make_grid(world, layout_of(config.parallel));
  // Then the precision: an explicit bfloat16 on a CPU without it fails before any work.
  std::string dtype_note;
  ops::ComputeType compute =
      ops::resolve_dtype(config.model.dtype, config_origin(config, "model.dtype"), &dtype_note);
  if (grid.world_size > 1) {  // "auto" on machines of different CPUs: float32 unless all have bf16
    int64_t fp32 = compute == ops::ComputeType::kFloat32;
    grid.world->all_reduce(&fp32, 1, comm::ReduceOp::kMax);
    if (fp32 && compute == ops::ComputeType::kBFloat16)
      compute = ops::ComputeType::kFloat32, dtype_note = "auto: another rank's CPU lacks AVX512-BF16";
  }
  if (dtype_note.empty())  // float32: say whether it was asked for or is the default
    dtype_note = config.model_keys_given.count("dtype")
                     ? "model.dtype = \"float32\""
                     : "model.dtype not set: float32 is the default; \"auto\" uses bfloat16 "
                       "where the CPU has AVX512-BF16";
  // Rank 0 alone looks at (and with --overwrite empties) the checkpoint folder; its refusal is
  // every rank's error, so the job ends with its one message (comm::run_on_world), not an abort.
  everyone_fails_with_rank0(*grid.world, [&] { prepare_checkpoint_dir(config, options); });
  set_num_threads(static_cast<int>(config.train.num_threads), comm::ranks_on_node());
  // The memory plan, before anything large is allocated: refuse a run that cannot fit.
  MemoryPlanInputs plan_in;
  plan_in.world_size = grid.world_size;
  plan_in.ranks_on_node = comm::ranks_on_node();
  plan_in.runtime_bytes = resident_bytes();
  plan_in.sgemm_size = options.sgemm_size;
  plan_in.resume = !options.resume.empty();
  plan_in.init_from = !options.init_from.empty();
  plan_in.bf16 = compute == ops::ComputeType::kBFloat16;
  plan_in.longest_document = longest_document(config.data.train_folder);
  const MemoryPlan plan = plan_memory(config, plan_in);
  check_memory(plan, options.memory_available >= 0 ? options.memory_available
                                                   : available_memory_bytes(plan_in.ranks_on_node));
  std::optional<Phase> phase(std::in_place, fmt::format(
      "building the model and reading the data (planned peak {} per rank)", format_bytes(plan.peak_bytes)));
  // Start lines of the start-up's phases (rank 0), so a large model does not wait in silence.
  const bool rank0 = grid.world_rank == 0;
  const auto elapsed = [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - g_process_start).count();
  };
  if (rank0)
    fmt::print(stderr, "train: building the model ({} parameters, {}) and reading the data "
               "(planned peak {} per rank)\n", plan.params_full,
               !options.resume.empty()    ? "weights from --resume"
               : !options.init_from.empty() ? "weights from --init-from"
                                            : fmt::format("drawn from train.seed = {}", config.train.seed),
               format_bytes(plan.peak_bytes));
  Run run(config, options, std::move(grid));
  if (rank0 && run.engine.has_lora()) {
    const model::LoraConfig& l = config.model.lora;
    const int64_t trainable = run.engine.train_full_layout().numel();
    fmt::print(stderr, "train: LoRA rank {}, alpha {}{} on {} modules: {} trainable parameters "
               "({:.2f}% of the model's {}), the base frozen\n", l.rank, l.alpha,
               l.use_rslora ? " (rsLoRA)" : "", run.engine.lora_modules().size(), trainable,
               100.0 * double(trainable) / double(plan.params_full), plan.params_full);
  }
  run.compute = compute;
  run.engine.set_compute_type(compute);
  phase.emplace("timing the GEMMs");
  if (rank0)
    fmt::print(stderr, "train: timing the GEMMs (n = {}; {:.1f} s so far)\n", options.sgemm_size,
               elapsed());
  run.sgemm_flops = measure_sgemm_flops(options.sgemm_size);

  phase.emplace("loading the start state");
  TrainSummary summary;
  summary.sgemm_flops = run.sgemm_flops;
  summary.bf16_gemm_flops = measure_gemm_bf16_flops(options.sgemm_size);
  summary.dtype = ops::compute_type_name(compute);
  run.gemm_flops = compute == ops::ComputeType::kBFloat16 ? summary.bf16_gemm_flops : run.sgemm_flops;
  summary.planned_peak_bytes = plan.peak_bytes;
  int64_t start = 0;
  fs::path resumed_from;  // the newest good checkpoint until this run saves one
  if (!options.resume.empty()) {
    const fs::path dir = resolve_checkpoint(options.resume);
    resumed_from = dir;
    const CheckpointState state = read_checkpoint_state(dir);
    if (run.engine.has_lora()) {
      resume_lora(run, dir, state);
    } else {
    check(!state.extra.is_object() || !state.extra.contains("lora"),
          "--resume {}: a LoRA checkpoint (the adapter only: state.json's extra.lora names its "
          "base), but lora.rank = 0; resume it with its [lora] section, or start a full "
          "fine-tune from `longtron export --merge-lora` of it", dir.string());
    run.load_full(dir, run.engine.params());
    {
      // HF tensors → this layout's local tensors (read straight into them) → this rank's ZeRO-1
      // slice.
      model::Params<float> local_m(run.engine.local_layout()), local_v(run.engine.local_layout());
      run.optimizer.set_step(
          load_hf_optimizer_shards(dir, run.engine.plan(), local_m, local_v, run.rank0));
      run.optimizer.load_state(local_m, local_v);
    }
    }
    start = state.step;
    check(start <= config.train.total_steps, "--resume {}: checkpoint step {} is past train.total_steps = {}",
          options.resume.string(), start, config.train.total_steps);
    if (run.rank0) fmt::print(stderr, "train: resumed from step {} ({})\n", start, dir.string());
  } else if (!options.init_from.empty()) {
    if (fs::is_regular_file(options.init_from / "state.json")) {
      const CheckpointState from = read_checkpoint_state(options.init_from);
      check(!from.extra.is_object() || !from.extra.contains("lora"),
            "--init-from {}: a LoRA checkpoint (the adapter only, not a model): start from "
            "`longtron export --merge-lora` of it, or from its base with --init-adapter {}",
            options.init_from.string(), options.init_from.string());
    }
    run.load_full(options.init_from, run.engine.params());
    if (run.engine.has_lora()) {
      run.lora_base = fs::absolute(options.init_from).lexically_normal();
      run.lora_base_fingerprint = base_fingerprint(run.lora_base.string());
      if (!options.init_adapter.empty()) {
        const PeftAdapter a = read_peft_adapter(options.init_adapter.string());
        check_adapter_matches(a.config, config.model.lora, config.model.type,
                              options.init_adapter.string());
        load_peft_adapter(run.engine, a, run.engine.train_params(),
                          "--init-adapter " + options.init_adapter.string());
      }
    }
  }
  if (run.engine.has_lora()) {
    // lora.base_dtype: "auto" holds a bf16 base when the run computes in bf16 and one process
    // holds the model replica; "bfloat16" insists (the engine refuses other layouts).
    const model::LoraBaseDtype want = config.model.lora.base_dtype;
    const bool bf16 = want == model::LoraBaseDtype::kBFloat16 ||
                      (want == model::LoraBaseDtype::kAuto && compute == ops::ComputeType::kBFloat16 &&
                       run.engine.mode() == "dense");
    run.engine.freeze_lora_base(bf16 ? model::LoraBaseStorage::kBFloat16
                                     : model::LoraBaseStorage::kFloat32);
  }
  check(options.init_adapter.empty() || run.engine.has_lora(),
        "--init-adapter {}: needs [lora] with rank > 0 (lora.rank is 0)", options.init_adapter.string());
  check(options.init_adapter.empty() || options.resume.empty(),
        "--init-adapter and --resume cannot be used together (a resumed run loads its adapter)");  // else: the engine drew train.seed's parameters (init_params of the full model, sliced)
  setup_preference(run, options, compute);
  summary.start_step = start;
  if (run.rank0) {
    // Found now rather than at the first save, which by default is the end of the run.
    if (!config.train.checkpoint_dir.empty())
      ensure_directory(config.train.checkpoint_dir, "train.checkpoint_dir");
    MetricsOptions mo;
    mo.total_steps = config.train.total_steps;
    mo.log_every = config.train.log_every;
    mo.console = options.console;
    mo.progress = options.progress;
    mo.resume_step = options.resume.empty() ? -1 : start;
    run.metrics = std::make_unique<MetricsWriter>(config.train.metrics_file, mo);
    summary.metrics_file = config.train.metrics_file;
    summary.plot_file = run.metrics->plot_path();
    const ops::GemmBackend gemm = ops::gemm_backend();
    fmt::print(stderr,
               "train: {} parameters, {} rows/epoch ({} steps), dp {}, tp {} ({}), {}, dtype {}{}\n"
               "train: GEMM {} ({}): fp32 {:.1f} GFLOP/s, bf16 {}; mfu against {}\n"
               "train: kernels: {}\n",
               run.engine.full_layout().numel(), run.loader.num_rows(), run.loader.steps_per_epoch(),
               run.dp->size(), run.grid.tp, run.engine.mode(), count_of(num_threads(), "thread"),
               summary.dtype, dtype_note.empty() ? "" : " (" + dtype_note + ")", gemm.library,
               gemm.isa, run.sgemm_flops * 1e-9,
               summary.bf16_gemm_flops > 0 ? fmt::format("{:.1f} GFLOP/s", summary.bf16_gemm_flops * 1e-9)
                                           : std::string("unavailable"),
               compute == ops::ComputeType::kBFloat16 ? "bf16" : "fp32", ops::kernels_chosen());
    fmt::print(stderr, "train: memory plan {} per rank at peak ({}; longtron train --dry-run shows it)\n",
               format_bytes(plan.peak_bytes), plan.peak_phase);
    const int64_t warmup = config.lr_scheduler.warmup_steps, total = config.train.total_steps;
    if (warmup > total)
      fmt::print(stderr, "train: note: lr_scheduler.warmup_steps {} exceeds train.total_steps {}: "
                 "the run ends inside the warmup (lr rises to {:.4g} = lr x {}/{}; no decay)\n",
                 warmup, total, config.optimizer.lr * double(total) / double(warmup), total, warmup);
  }
  auto valid = [&](int64_t step) {
    if (!run.valid_rows) return;
    Phase p(fmt::format("validating at step {}", step));
    const ValidRow row = run.validate_row(step);
    summary.valid.emplace_back(step, row.valid_loss);
    if (run.metrics) run.metrics->valid(row);
  };
  if (rank0) fmt::print(stderr, "train: start-up took {:.1f} s\n", elapsed());
  const auto t0 = std::chrono::steady_clock::now();
  if (start == 0) {
    if (rank0 && run.valid_rows)
      fmt::print(stderr, "train: validating at step 0 ({})\n",
                 count_of(run.valid_rows->num_rows(), "row"));
    valid(0);
  }
  if (rank0) fmt::print(stderr, "train: step {} begins after {:.1f} s\n", start + 1, elapsed());
  const int64_t total = config.train.total_steps;
  int64_t skipped_in_a_row = 0;
  for (int64_t step = start + 1; step <= total; ++step) {
    phase.emplace(fmt::format("training step {} (planned peak {} per rank)", step,
                              format_bytes(plan.peak_bytes)));
    const TrainRow row = run.step(step, step == start + 1 && !options.dump_grads.empty());
    summary.losses.push_back(row.loss);
    summary.grad_norms.push_back(row.grad_norm);
    summary.rows.push_back(row);
    summary.end_step = step;
    if (run.metrics) run.metrics->train(row);
    skipped_in_a_row = row.skipped ? skipped_in_a_row + 1 : 0;
    if (row.skipped)
      report_skip(row, skipped_in_a_row, config.train.max_skipped_steps, run.rank0,
                  summary.last_checkpoint.empty() ? resumed_from : summary.last_checkpoint);
    const int64_t ve = config.train.valid_every, se = config.train.save_every;
    if (step == total || (ve > 0 && step % ve == 0)) valid(step);
    if (!row.skipped) ++summary.updates;
    // A skipped step changed no weights: its checkpoint would only move the step counter past
    // the problem, so the last good one stays the newest (even at the end of the run).
    if (!row.skipped && (step == total || (se > 0 && step % se == 0))) {
      Phase p(fmt::format("saving the checkpoint of step {}", step));
      const fs::path dir = run.save(step);
      if (!dir.empty()) summary.last_checkpoint = dir;
    }
  }
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (run.metrics) run.metrics->finish();
  summary.measured_peak_bytes = peak_resident_bytes();
  // A run whose weights did not move, or whose last step was refused, did not do what was asked:
  // it ends with an error (every rank saw the same skips, so every rank throws).
  const fs::path newest = summary.last_checkpoint.empty() ? resumed_from : summary.last_checkpoint;
  const std::string newest_text = newest.empty() ? std::string("none") : newest.string();
  if (!summary.rows.empty()) {
    check(summary.updates > 0,
          "train: none of the {} steps of this run applied an update (all were skipped: see the "
          "messages above); no checkpoint was written. Last good checkpoint: {}. Lower "
          "optimizer.lr, raise lr_scheduler.warmup_steps or check the data",
          summary.rows.size(), newest_text);
    check(!summary.rows.back().skipped,
          "train: the last step ({}) was skipped (see the message above), so no checkpoint holds "
          "it; {} of {} steps applied an update. Last good checkpoint: {}", summary.rows.back().step,
          summary.updates, summary.rows.size(), newest_text);
  }
  return summary;
}

}  // namespace longtron::train
